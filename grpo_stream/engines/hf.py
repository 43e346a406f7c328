"""The Hugging Face engine: a transformers causal LM sampled by a hand-written KV-cache loop.

Invariants (see `grpo_stream.engines.base` for the completion conventions):

- All P prompts x G samples run as one left-padded batch of P*G rows (row p*G + g is
  sample g of prompt p); each prompt is prefilled once and its KV cache repeated G times
  (`Decoder.run(repeats=G)`). Position ids come from the attention mask, so a row's numbers
  do not depend on how much padding it got.
- Sampling uses exactly `softmax(logits / temperature)`, optionally truncated to the
  nucleus `top_p`; there is no top-k and no other logits processor. The reported log-prob
  is `log_softmax(logits / temperature)` of the sampled token in fp32, before nucleus
  truncation: what a teacher-forced forward pass of the same weights gives the trainer.
- A row stops at its first end-of-sequence token (kept as its last token); the loop ends
  when every row has stopped or after `max_tokens` steps.
- With a `seed`, sampling draws from a private `torch.Generator`, so equal inputs and seed
  give equal outputs; without one it draws from torch's global generator.
- `load_weights` checks names, shapes and completeness of the whole version before it
  writes any parameter (`grpo_stream.engines.hf_weights`), then copies in place under no_grad
  (the model object is kept).
- In-flight updates (`enable_inflight`, generator.inflight_updates): a version fetched on a
  thread (`fetch_in_background`) is applied between two decoding steps of `generate` by the
  generator's hook (`take_fetched`); the decode loop (`grpo_stream.engines.decode`) records
  which version gave each step's logits. `complete` and `open_turns` (episodes) never swap
  mid-turn; a turn cache filled under an older version is dropped (engines.turn_cache).

Why a hand-written loop rather than `model.generate`: on the CPU it is as fast for the tiny
model (measured within noise, about 8k tokens/s on one thread, 16 x 8 x 8 tokens), it
computes only the last position's logits in the prefill, and it cannot pick up a model's
generation_config defaults (top_k=50, repetition penalty, ...) that would make behaviour
log-probs disagree with the trainer's.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import structlog

from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.engines.base import check_generate, check_rows, to_torch
from grpo_stream.engines.decode import Decoded, Decoder, left_pad, version_runs
from grpo_stream.engines.hf_weights import plan_weight_update
from grpo_stream.engines.inflight import BackgroundFetch
from grpo_stream.engines.lora import HFAdapter
from grpo_stream.engines.turn_cache import TurnCache
from grpo_stream.models.adapter import split_adapter
from grpo_stream.models.loading import load_policy, load_tokenizer, resolve_device
from grpo_stream.sampling import Completion, GroupSample, Sampling
from grpo_stream.transport.fetcher import VersionFetcher

if TYPE_CHECKING:
    import numpy as np
    import torch

    from grpo_stream.config import ModelSettings

log = structlog.get_logger()


class HFEngine:
    """Samples groups of completions from a transformers model held in this process."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str = "cpu",
        transport: TransportSettings | None = None,
        security: SecuritySettings | None = None,
        version: int = 0,
        weights: WeightsSettings | None = None,
        secret: bytes | None = None,
    ) -> None:
        import torch

        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.version = version
        self._transport = transport or TransportSettings()
        self._security = security or SecuritySettings()
        self._eos_ids = _eos_ids(model, tokenizer)
        if not self._eos_ids:
            raise ValueError("the model has no end-of-sequence token (generation_config/tokenizer)")
        pad = tokenizer.pad_token_id
        self._pad_id = int(pad) if pad is not None else min(self._eos_ids)
        self._lora: Any = None  # engines.lora.HFAdapter once an adapter version arrives
        # the version held (delta base) and, with weights.relay, the relay serving it; the
        # run's secret signs every request (only members get weights)
        self._fetcher = VersionFetcher(
            self._transport, self._security, weights or WeightsSettings(), secret
        )
        # transformers 5 renamed the forward argument past_key_values to cache.
        forward_args = inspect.signature(self.model.forward).parameters
        cache_arg = "cache" if "cache" in forward_args else "past_key_values"
        self._decoder = Decoder(self.model, cache_arg, self._eos_ids)
        self._between_steps: Callable[[], None] | None = None  # enable_inflight
        self._keep_kv = False
        self._background = BackgroundFetch(lambda address: self._fetcher.fetch(address, -1))

    @classmethod
    def from_settings(
        cls,
        model: ModelSettings,
        transport: TransportSettings,
        security: SecuritySettings,
        device: str | None = None,
        weights: WeightsSettings | None = None,
        secret: bytes | None = None,
    ) -> HFEngine:
        """Load `model.name_or_path` (bf16 on GPUs, fp32 on CPU unless `model.dtype` says)."""
        dev = resolve_device(device)
        policy = load_policy(model.name_or_path, dtype=model.dtype, device=dev, trainable=False)
        tokenizer = load_tokenizer(model.name_or_path)
        log.info(
            "engine.loaded",
            engine="hf",
            model=model.name_or_path,
            device=dev,
            dtype=str(next(policy.parameters()).dtype),
        )
        return cls(policy, tokenizer, dev, transport, security, weights=weights, secret=secret)

    # ---- generation -------------------------------------------------------------------

    def enable_inflight(
        self, between_steps: Callable[[], None] | None, keep_kv: bool = False
    ) -> None:
        """Call `between_steps` between the decoding steps of `generate` (it may apply a
        fetched version: `take_fetched`; None: no more); `keep_kv`: see engines.decode."""
        self._between_steps, self._keep_kv = between_steps, keep_kv

    def generate(
        self, prompts: list[str], group_size: int, sampling: Sampling
    ) -> list[GroupSample]:
        """Sample `group_size` completions of at most `sampling.max_tokens` tokens for each
        prompt."""
        check_generate(prompts, group_size)
        start = time.perf_counter()
        prompt_ids = self._encode(prompts)
        flat = self.sample_rows(prompt_ids, sampling, inflight=True, repeats=group_size)
        groups = [
            GroupSample(
                prompt_ids=list(ids), completions=flat[p * group_size : (p + 1) * group_size]
            )
            for p, ids in enumerate(prompt_ids)
        ]
        seconds = time.perf_counter() - start
        new_tokens = sum(len(c.token_ids) for c in flat)
        log.debug(
            "engine.generated",
            prompts=len(prompts),
            group_size=group_size,
            tokens=new_tokens,
            seconds=round(seconds, 4),
            tokens_per_s=round(new_tokens / max(seconds, 1e-9), 1),
            version=self.version,
        )
        return groups

    def complete(self, rows: list[list[int]], sampling: Sampling) -> list[Completion]:
        """One continuation of at most `sampling.max_tokens` tokens per row of token ids, fed
        exactly as given, each row prefilled whole (stateless; episodes keep the KV cache
        between turns with `open_turns`)."""
        check_rows(rows)
        return self.sample_rows(rows, sampling)

    def open_turns(self) -> TurnCache:
        """A KV cache kept between the turns of one batch of episodes: each turn then
        prefills only the tokens added since the last (`grpo_stream.engines.turn_cache`)."""
        return TurnCache(
            decoder=self._decoder,
            pad_id=self._pad_id,
            device=self.device,
            version=lambda: self.version,
            finish=self._completions,
        )

    def sample_rows(
        self,
        rows: list[list[int]],
        sampling: Sampling,
        inflight: bool = False,
        repeats: int = 1,
    ) -> list[Completion]:
        """The one sampling setup: left-pad `rows` (checked by the caller), decode under
        inference mode (seeded by `sampling.seed`, `engines.decode`). `inflight`: versions may
        be swapped in between steps (`enable_inflight`); each Completion says which version
        sampled which tokens. `repeats`: completions per row, each row prefilled once
        (len(rows) * repeats out, a row's adjacent)."""
        import torch

        input_ids, mask = left_pad(rows, self._pad_id)  # (B, T) each
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        hook = self._between_steps if inflight else None
        with torch.inference_mode():
            got = self._decoder.run(
                input_ids,
                mask,
                sampling,
                version=lambda: self.version,
                between_steps=hook,
                keep_kv=self._keep_kv,
                repeats=repeats,
            )
        return self._completions(got, sampling.max_tokens)

    def _encode(self, prompts: list[str]) -> list[list[int]]:
        encoded: list[list[int]] = self.tokenizer(prompts)["input_ids"]
        for text, ids in zip(prompts, encoded, strict=True):
            if not ids:
                raise ValueError(f"prompt {text!r} encodes to no tokens")
        return encoded

    def _completions(self, got: Decoded, max_tokens: int) -> list[Completion]:
        tok_rows: list[list[int]] = got.tokens.cpu().tolist()
        lp_rows: list[list[float]] = got.logprobs.cpu().tolist()
        len_rows: list[int] = got.lengths.cpu().tolist()
        out = []
        for row, n in enumerate(len_rows):
            toks = tok_rows[row][:n]
            ended = bool(toks) and toks[-1] in self._eos_ids
            out.append(
                Completion(
                    token_ids=toks,
                    logprobs=lp_rows[row][:n],
                    text=self.tokenizer.decode(toks, skip_special_tokens=True),
                    truncated=not ended and n == max_tokens,
                    version_runs=version_runs(got.step_versions, n),
                )
            )
        return out

    # ---- weights ----------------------------------------------------------------------

    def load_weights(
        self, named: Iterable[tuple[str, torch.Tensor | np.ndarray]], version: int
    ) -> None:
        """Validate a complete weights version, then copy it into the model in place."""
        import torch

        start = time.perf_counter()
        items = [(name, to_torch(value)) for name, value in named]
        adapter = split_adapter(items)  # LoRA: a version is an adapter and its manifest
        if adapter is not None:
            self._lora = self._lora or HFAdapter(self.model)
            self._lora.apply(*adapter)
        else:
            plan = plan_weight_update(self.model, items)
            with torch.no_grad():
                for target, source in plan:
                    target.copy_(source)
        self.version = version
        log.info(
            "engine.weights_loaded",
            version=version,
            tensors=len(items),
            mb=round(sum(t.numel() * t.element_size() for _, t in items) / 2**20, 3),
            seconds=round(time.perf_counter() - start, 4),
        )

    def update_from_server(self, address: str, version: int) -> int:
        """Fetch `version` (-1: newest) from the weight server at `address` and apply it.

        The engine keeps the wire arrays of the version it holds (a `Replica`), so the server
        can send a delta from it; a refused delta is re-fetched in full (see transport.fetch).
        """
        got, named = self._fetcher.fetch(address, version)
        self.load_weights(named, got)
        return got

    def fetch_in_background(self, address: str) -> bool:
        """Start fetching the newest version on a thread (False: one is already pending);
        `take_fetched` applies it once it has arrived."""
        return self._background.start(address)

    @property
    def fetch_pending(self) -> bool:
        """A background fetch is running or its version was not taken yet."""
        return self._background.busy

    def wait_fetched(self, timeout_s: float) -> bool:
        """Block until the background fetch has finished (False: none, or still running)."""
        return self._background.wait(timeout_s)

    def take_fetched(self) -> int | None:
        """Apply the version a background fetch brought (None: none arrived yet); re-raises
        the TransportError a failed one raised."""
        got = self._background.take()
        if got is None:
            return None
        self.load_weights(got[1], got[0])
        return got[0]

    def close(self) -> None:
        """Drop the model and close the ZeroMQ context (sockets linger 0, so this never hangs)."""
        self._background.close()
        self._fetcher.close()
        self.model = None


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    config_eos = model.generation_config.eos_token_id if model.generation_config else None
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos is not None:
        ids.update(int(i) for i in config_eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
