"""The Hugging Face engine: a transformers causal LM sampled by a hand-written KV-cache loop.

Invariants (see `grpo_stream.engines.base` for the completion conventions):

- All P prompts x G samples run as one left-padded batch of P*G rows (row p*G + g is
  sample g of prompt p); position ids come from the attention mask, so a row's numbers do
  not depend on how much padding it got.
- Sampling uses exactly `softmax(logits / temperature)`, optionally truncated to the
  nucleus `top_p`; there is no top-k and no other logits processor. The reported log-prob
  is `log_softmax(logits / temperature)` of the sampled token in fp32, before nucleus
  truncation: what a teacher-forced forward pass of the same weights gives the trainer.
- A row stops at its first end-of-sequence token (kept as its last token); the loop ends
  when every row has stopped or after `max_tokens` steps.
- With a `seed`, sampling draws from a private `torch.Generator`, so equal inputs and seed
  give equal outputs; without one it draws from torch's global generator.
- `load_weights` checks names, shapes and completeness of the whole version before it
  writes any parameter, then copies in place under no_grad (the model object is kept).

Why a hand-written loop rather than `model.generate`: on the CPU it is as fast for the tiny
model (measured within noise, about 8k tokens/s on one thread, 16 x 8 x 8 tokens), it
computes only the last position's logits in the prefill, and it cannot pick up a model's
generation_config defaults (top_k=50, repetition penalty, ...) that would make behaviour
log-probs disagree with the trainer's.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import structlog

from grpo_stream.engines.base import (
    Completion,
    GroupSample,
    resolve_device,
    to_torch,
)
from grpo_stream.models.adapter import split_adapter
from grpo_stream.transport.settings import SecuritySettings, TransportSettings, WeightsSettings

if TYPE_CHECKING:
    import numpy as np
    import torch

    from grpo_stream.config import ModelSettings
    from grpo_stream.transport.fetch import Replica
    from grpo_stream.transport.relay import Relay

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
        self._zmq_ctx: Any = None
        self._replica: Replica | None = None  # wire arrays of the version held (delta base)
        self._lora: Any = None  # engines.lora.HFAdapter once an adapter version arrives
        self._weights = weights or WeightsSettings()
        self._relay: Relay | None = None  # serves what we fetch to others (weights.relay)
        # transformers 5 renamed the forward argument past_key_values to cache.
        forward_args = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"

    @classmethod
    def from_settings(
        cls,
        model: ModelSettings,
        transport: TransportSettings,
        security: SecuritySettings,
        device: str | None = None,
        weights: WeightsSettings | None = None,
    ) -> HFEngine:
        """Load `model.name_or_path` (bf16 on GPUs, fp32 on CPU unless `model.dtype` says)."""
        from grpo_stream.models.loading import load_policy, load_tokenizer

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
        return cls(policy, tokenizer, dev, transport, security, weights=weights)

    # ---- generation -------------------------------------------------------------------

    def generate(
        self,
        prompts: list[str],
        group_size: int,
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[GroupSample]:
        """Sample `group_size` completions of at most `max_tokens` tokens for each prompt."""
        import torch

        _check_args(prompts, group_size, max_tokens, temperature, top_p)
        start = time.perf_counter()
        prompt_ids = self._encode(prompts)
        rows = [ids for ids in prompt_ids for _ in range(group_size)]
        input_ids, mask = self._left_pad(rows)
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        with torch.inference_mode():
            tokens, logprobs, lengths = self._sample(
                input_ids, mask, max_tokens, temperature, top_p, generator
            )
        groups = self._to_groups(prompt_ids, group_size, tokens, logprobs, lengths, max_tokens)
        seconds = time.perf_counter() - start
        new_tokens = int(lengths.sum())
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

    def complete(
        self,
        rows: list[list[int]],
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[Completion]:
        """One continuation of at most `max_tokens` tokens per row of token ids, fed exactly
        as given (the multi-turn path: `grpo_stream.envs.episodes`). Each turn prefills its
        whole row again: the KV cache is not kept between turns (cheap at tiny-model sizes)."""
        import torch

        if not rows or any(not r for r in rows):
            raise ValueError("complete needs non-empty rows of token ids")
        _check_args(["-"], 1, max_tokens, temperature, top_p)
        input_ids, mask = self._left_pad(rows)
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        with torch.inference_mode():
            tokens, logprobs, lengths = self._sample(
                input_ids, mask, max_tokens, temperature, top_p, generator
            )
        return self._completions(tokens, logprobs, lengths, max_tokens)

    def _encode(self, prompts: list[str]) -> list[list[int]]:
        encoded: list[list[int]] = self.tokenizer(prompts)["input_ids"]
        for text, ids in zip(prompts, encoded, strict=True):
            if not ids:
                raise ValueError(f"prompt {text!r} encodes to no tokens")
        return encoded

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, ids in enumerate(rows):
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[i, width - len(ids) :] = 1
        return input_ids.to(self.device), mask.to(self.device)  # (B, T), (B, T)

    def _sample(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        max_tokens: int,
        temperature: float,
        top_p: float,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decode loop: (tokens (B, N), logprobs (B, N), lengths (B,)), N <= max_tokens."""
        import torch
        from transformers import DynamicCache

        batch = input_ids.shape[0]
        eos = torch.tensor(sorted(self._eos_ids), device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T): pad-independent positions
        cache = {self._cache_arg: DynamicCache()}  # filled in place by every forward
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **cache,
        )
        next_pos = positions[:, -1:] + 1  # (B, 1)
        lengths = torch.full((batch,), max_tokens, dtype=torch.long, device=self.device)
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        tokens, logprobs = [], []
        for step in range(max_tokens):
            logp = torch.log_softmax(out.logits[:, -1, :].float() / temperature, dim=-1)  # (B, V)
            tok = _draw(logp, top_p, generator)  # (B,)
            tokens.append(tok)
            logprobs.append(logp.gather(-1, tok[:, None])[:, 0])
            ended = ~finished & torch.isin(tok, eos)
            lengths[ended] = step + 1
            finished |= ended
            if step == max_tokens - 1 or bool(finished.all()):
                break
            mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=-1)
            out = self.model(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=next_pos,
                use_cache=True,
                **cache,
            )
            next_pos = next_pos + 1
        return torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1), lengths

    def _to_groups(
        self,
        prompt_ids: list[list[int]],
        group_size: int,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        lengths: torch.Tensor,
        max_tokens: int,
    ) -> list[GroupSample]:
        flat = self._completions(tokens, logprobs, lengths, max_tokens)
        return [
            GroupSample(
                prompt_ids=list(ids), completions=flat[p * group_size : (p + 1) * group_size]
            )
            for p, ids in enumerate(prompt_ids)
        ]

    def _completions(
        self, tokens: torch.Tensor, logprobs: torch.Tensor, lengths: torch.Tensor, max_tokens: int
    ) -> list[Completion]:
        tok_rows: list[list[int]] = tokens.cpu().tolist()
        lp_rows: list[list[float]] = logprobs.cpu().tolist()
        len_rows: list[int] = lengths.cpu().tolist()
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
            from grpo_stream.engines.lora import HFAdapter

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
        import zmq

        from grpo_stream.transport.fetch import Replica

        if self._zmq_ctx is None:
            self._zmq_ctx = zmq.Context()
        if self._replica is None:
            self._replica = Replica()
        if self._weights.relay and self._relay is None:
            from grpo_stream.transport.relay import Relay

            self._relay = Relay(
                self._zmq_ctx, self._weights.relay_bind, self._transport, self._security,
                wait_s=self._weights.relay_stall_s,
            )  # fmt: skip
        got = self._replica.fetch(
            self._zmq_ctx, address, self._transport, self._security, version=version,
            weights=self._weights, relay=self._relay,
        )  # fmt: skip
        self.load_weights(self._replica.named(), got)
        return got

    def close(self) -> None:
        """Drop the model and close the ZeroMQ context (sockets linger 0, so this never hangs)."""
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        if self._zmq_ctx is not None:
            self._zmq_ctx.destroy(linger=0)
            self._zmq_ctx = None
        self.model = None


def plan_weight_update(
    model: Any, items: list[tuple[str, torch.Tensor]]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pair each named tensor with the model tensor it replaces; raise before any write.

    Names are the model's parameter (or buffer) names. Tied parameters (lm_head.weight sharing the
    embedding) count as sent when any of their names is sent. Unknown names, shape
    mismatches and parameters left out are errors.
    """
    targets = dict(model.named_parameters(remove_duplicate=False))
    targets.update(model.named_buffers(remove_duplicate=False))
    plan, sent = [], set()
    for name, tensor in items:
        target = targets.get(name)
        if target is None:
            raise ValueError(f"weights version has unknown tensor {name!r}")
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"weights tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"model expects {tuple(target.shape)}"
            )
        plan.append((target.data, tensor))
        sent.add(id(target))
    missing = [n for n, p in model.named_parameters() if id(p) not in sent]
    if missing:
        raise ValueError(
            f"weights version is incomplete: {len(missing)} parameters missing, e.g. {missing[0]!r}"
        )
    return plan


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


def _draw(logp: torch.Tensor, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from the tempered distribution, within the nucleus `top_p`."""
    import torch

    probs = logp.exp()  # (B, V)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        outside = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def _check_args(
    prompts: list[str], group_size: int, max_tokens: int, temperature: float, top_p: float
) -> None:
    if not prompts:
        raise ValueError("generate needs at least one prompt")
    if group_size < 1 or max_tokens < 1:
        raise ValueError("group_size and max_tokens must be at least 1")
    if temperature <= 0:
        raise ValueError("temperature must be positive (greedy decoding is not supported)")
    if not 0 < top_p <= 1:
        raise ValueError("top_p must be in (0, 1]")
