"""The vllm engine: vLLM's AsyncLLM driven from the generator, one request per prompt.

Invariants (see `grpo_stream.engines.base` for the completion conventions):

- Streaming: `submit` makes each prompt its own request (n = G) at once, so vLLM batches
  requests of different PromptBatches together; `take_finished` hands back each group as soon
  as its G completions are done. `generate` and `complete` are the same requests waited for
  together (episodes, evaluation).
- Sampling is `SamplingParams(n, temperature, top_p, logprobs=0)` with no top-k, the model's
  generation_config ignored (`generation_config="vllm"`) and `logprobs_mode=
  "processed_logprobs"`: the reported log-prob is that of the distribution sampled from,
  `log_softmax(logits / temperature)` at top_p = 1, the numbers the hf engine reports.
- Prompts are token ids from the run's tokenizer (`TokensPrompt`); vLLM keeps the
  end-of-sequence token in `token_ids`; texts are the tokenizer's decoding (special tokens
  skipped); `finish_reason == "length"` marks a truncated completion.
- With a `seed`, prompt i of a call (or of a PromptBatch) gets the i-th
  `random.Random(seed).getrandbits(31)` (vLLM seeds the n samples of a request seed+i), so
  equal inputs and seed give equal outputs.
- Every completion carries `version_runs` from vLLM's per-token `weight_versions` spans,
  labelled with our integer versions: exact for a request that an update paused midway, or
  that waited in the queue across one.
- Weights change through vLLM's protocol only, with generation paused (`vllm.update`).
- Prefix caching is on; each request's cache salt is the version it was submitted under, so
  no request reuses blocks that another version computed (except, with inflight_kv = "keep",
  a request that waited in the queue across an update: see docs/guide/vllm.md).
- A dead engine core surfaces as `VLLMEngineDied` from `take_finished`, `generate`,
  `complete` and updates.

vLLM is imported inside functions only: importing this module never needs it.
"""

from __future__ import annotations

import gc
import itertools
import queue
import time
import uuid
from collections.abc import Callable, Hashable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.engines.base import check_generate, check_rows
from grpo_stream.engines.lora import vllm_lora_args
from grpo_stream.engines.streaming import seeds
from grpo_stream.engines.vllm import compat as compat
from grpo_stream.engines.vllm.loop import Finished, Loop, Request
from grpo_stream.engines.vllm.update import Updater, VLLMEngineDied
from grpo_stream.models.loading import (
    load_tokenizer,
    resolve_device,
    resolve_dtype_name,
    resolve_model,
)
from grpo_stream.progress import long_wait
from grpo_stream.sampling import Completion, GroupSample, Sampling

if TYPE_CHECKING:
    import numpy as np
    import torch

    from grpo_stream.config import GeneratorSettings, ModelSettings
    from grpo_stream.config.lora import LoraSettings

log = structlog.get_logger()

DEAD_POLL_S = 1.0  # how often a blocking wait checks that the engine core is alive


class VLLMEngine:
    """Samples groups of completions with an AsyncLLM held in this process."""

    def __init__(self, llm: Any, loop: Loop, tokenizer: Any, updater: Updater) -> None:
        self.llm = llm
        self.tokenizer = tokenizer  # the trainer's (models.loading): prompts and episodes
        self.last_cached_tokens: list[int] = []
        self.updater = updater
        self._loop = loop
        self._sink: queue.Queue[Finished] = queue.Queue()
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self._dropped: set[Hashable] = set()  # aborted keys: their results are dropped
        self._closed = False

    @property
    def version(self) -> int:
        """The weights version new requests run with."""
        return self.updater.version

    @classmethod
    def from_settings(
        cls,
        model: ModelSettings,
        generator: GeneratorSettings,
        transport: TransportSettings,
        security: SecuritySettings,
        device: str | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        lora: LoraSettings | None = None,
        weights: WeightsSettings | None = None,
        secret: bytes | None = None,
    ) -> VLLMEngine:
        """Start vLLM on `model.name_or_path` (`device` only picks the dtype for "auto").
        Refuses a vLLM without the API this engine uses (vllm.compat), in one line.
        `secret`: the run's, which signs the relay's claim (`weights.relay`)."""
        compat.require(compat.detect())
        dev = resolve_device(device)
        path = resolve_model(model.name_or_path)
        lora_args: dict[str, Any] = {}
        if lora is not None and lora.enabled:
            lora_args = vllm_lora_args(lora)
        args = compat.engine_args(
            model=path,
            tokenizer=path,
            dtype=resolve_dtype_name(model.dtype, dev),
            seed=seed,
            gpu_memory_utilization=generator.gpu_memory_utilization,
            tensor_parallel_size=generator.tensor_parallel,  # the GPUs placement gave it
            max_model_len=max_model_len,
            # CUDA graphs pay off on GPUs; on the CPU eager mode is the supported path.
            enforce_eager=dev.startswith("cpu"),
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            enable_prefix_caching=True,  # episodes: each turn reuses its prefix's KV
            block_size=generator.vllm_block_size,  # None: vLLM's default
            **lora_args,
        )
        loop = Loop()
        with long_wait("model.load", engine="vllm", model=model.name_or_path):
            llm = loop.run(_start(args))
        updater = Updater.start(
            llm,
            loop,
            path,
            transport,
            security,
            weights or WeightsSettings(),
            lora=bool(lora_args),
            model_name=model.name_or_path,
            secret=secret,
        )
        log.info(
            "engine.loaded",
            engine="vllm",
            model=model.name_or_path,
            device=dev,
            vllm=compat.installed_version(),
        )
        return cls(llm, loop, load_tokenizer(model.name_or_path), updater)

    # ---- streaming ----------------------------------------------------------------------

    def submit(
        self,
        key: Hashable,
        prompt_ids: list[int],
        group_size: int,
        sampling: Sampling,
        sink: queue.Queue[Finished] | None = None,
    ) -> None:
        """Start sampling `group_size` completions of `prompt_ids` now; its group comes back
        through `take_finished` (or `sink`) under `key`."""
        if not prompt_ids or group_size < 1:
            raise ValueError("submit needs prompt ids and group_size >= 1")
        params = compat.sampling(group_size, sampling)
        prompt = compat.token_prompt([int(t) for t in prompt_ids], f"v{self.version}")
        rid = f"{self._prefix}-{next(self._ids)}"
        adapter, version = self.updater.acquire()
        tag = (0 if adapter is None else adapter.lora_int_id, version)
        args, kwargs = (prompt, params), {"lora_request": adapter}
        self._loop.request(self.llm, Request(rid, key, args, kwargs, sink or self._sink, tag))

    def encode(self, prompts: list[str]) -> list[list[int]]:
        """Token ids of each prompt, as the trainer tokenizes them."""
        encoded: list[list[int]] = self.tokenizer(prompts)["input_ids"]
        for text, ids in zip(prompts, encoded, strict=True):
            if not ids:
                raise ValueError(f"prompt {text!r} encodes to no tokens")
        return encoded

    @property
    def running(self) -> int:
        """Requests submitted and not finished."""
        return len(self._loop.requests)

    def capacity(self, max_tokens: int) -> int:
        """Sequences the engine runs at once: vLLM's max_num_seqs, or fewer when its KV cache
        holds fewer sequences of `max_tokens` completion tokens and one prompt block."""
        return compat.capacity(self.llm, max_tokens)

    def take_finished(self, timeout_s: float = 0.0) -> list[tuple[Hashable, GroupSample, float]]:
        """(key, group, seconds from submission) of every request finished by now, waiting up
        to `timeout_s` for the first. Raises VLLMEngineDied when the engine core died."""
        got = self._collect(self._sink, timeout_s)
        if not got:
            self.check_alive()
        kept = [f for f in got if f.key not in self._dropped]
        self._dropped.difference_update(f.key for f in got)
        return [(f.key, self._group(f), f.seconds) for f in kept]

    def abort(self, keys: set[Hashable]) -> int:
        """Stop the requests whose key is in `keys` (their leases went back to the hub);
        their results, and any already finished but not taken, never come back. Returns how
        many were running."""
        rids = [rid for rid, key in list(self._loop.requests.items()) if key in keys]
        self._dropped.update(keys)
        if rids:
            self._loop.run(self.llm.abort(rids))
        return len(rids)

    def adapters(self) -> set[int]:
        """The LoRA adapter ids vLLM holds (LoRA runs: the current version's only)."""
        return set(self._loop.run(self.llm.list_loras()))

    def reset_prefix_cache(self) -> bool:
        """Empty vLLM's prefix cache (False: vLLM could not, requests are running)."""
        return self._loop.run(compat.reset_prefix_cache(self.llm))

    def check_alive(self) -> None:
        if compat.is_dead(self.llm):
            raise VLLMEngineDied("vLLM's engine core died (EngineDeadError)")

    # ---- whole calls --------------------------------------------------------------------

    def generate(
        self, prompts: list[str], group_size: int, sampling: Sampling
    ) -> list[GroupSample]:
        """Sample `group_size` completions of at most `sampling.max_tokens` tokens for each
        prompt."""
        check_generate(prompts, group_size)
        start = time.perf_counter()
        sink: queue.Queue[Finished] = queue.Queue()
        per_prompt = seeds(sampling.seed, len(prompts))
        for i, (ids, seed) in enumerate(zip(self.encode(prompts), per_prompt, strict=True)):
            self.submit(i, ids, group_size, replace(sampling, seed=seed), sink)
        done = self._wait_all(sink, len(prompts))
        groups = [self._group(done[i]) for i in range(len(prompts))]
        log.debug(
            "engine.generated",
            prompts=len(prompts),
            group_size=group_size,
            tokens=sum(len(c.token_ids) for g in groups for c in g.completions),
            seconds=round(time.perf_counter() - start, 4),
            version=self.version,
        )
        return groups

    def complete(self, rows: list[list[int]], sampling: Sampling) -> list[Completion]:
        """One continuation of at most `sampling.max_tokens` tokens per row of token ids, fed
        exactly as given (the multi-turn path); rows sharing a cached prefix reuse its KV
        blocks."""
        check_rows(rows)
        sink: queue.Queue[Finished] = queue.Queue()
        for i, (row, seed) in enumerate(zip(rows, seeds(sampling.seed, len(rows)), strict=True)):
            self.submit(i, row, 1, replace(sampling, seed=seed), sink)
        done = self._wait_all(sink, len(rows))
        outputs = [done[i].output for i in range(len(rows))]
        self.last_cached_tokens = [int(out.num_cached_tokens or 0) for out in outputs]
        return [
            self._completion(done[i].output.outputs[0], done[i].tag[1]) for i in range(len(rows))
        ]

    def _wait_all(self, sink: queue.Queue[Finished], count: int) -> dict[Hashable, Finished]:
        done: dict[Hashable, Finished] = {}
        while len(done) < count:
            for f in self._collect(sink, DEAD_POLL_S):
                _raise_error(f)
                done[f.key] = f
            if len(done) < count:
                self.check_alive()
        return done

    def _collect(self, sink: queue.Queue[Finished], timeout_s: float) -> list[Finished]:
        """Requests ended by now (waiting up to `timeout_s` for the first); each gives back
        the adapter it held."""
        got = _drain(sink, timeout_s)
        for f in got:
            self.updater.release(f.tag[0])
        return got

    def _group(self, f: Finished) -> GroupSample:
        _raise_error(f)
        out = f.output
        return GroupSample(
            prompt_ids=[int(t) for t in out.prompt_token_ids],
            completions=[self._completion(c, f.tag[1]) for c in out.outputs],
        )

    def _completion(self, comp: Any, submitted: int) -> Completion:
        """`submitted`: the version when the request was submitted. LoRA: a request runs
        wholly on the adapter it was submitted with, so that is its version; full weights:
        vLLM's per-token spans say which version sampled each token."""
        ids = [int(t) for t in comp.token_ids]
        logprobs = [float(pos[t].logprob) for t, pos in zip(ids, comp.logprobs, strict=True)]
        lora = self.updater.adapter is not None
        return Completion(
            token_ids=ids,
            logprobs=logprobs,
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            truncated=comp.finish_reason == "length",
            version_runs=[(0, submitted)] if lora else compat.version_runs(comp),
        )

    # ---- weights ------------------------------------------------------------------------

    def enable_inflight(
        self, between_steps: Callable[[], None] | None, keep_kv: bool = False
    ) -> None:
        """Apply versions in flight: running requests pause and continue under the new
        weights (vLLM steps itself: `between_steps` is not needed and not called)."""
        self.updater.inflight, self.updater.keep_kv = between_steps is not None, keep_kv

    def load_weights(
        self, named: Iterable[tuple[str, torch.Tensor | np.ndarray]], version: int
    ) -> None:
        """Apply a complete version (Hugging Face names) through vLLM's update protocol."""
        self.updater.apply(list(named), version)

    def update_from_server(self, address: str, version: int) -> int:
        """Fetch `version` (-1: the newest) once for this generator and apply it."""
        return self.updater.update_from_server(address, version)

    def fetch_in_background(self, address: str) -> bool:
        """Fetch and apply the newest version on a thread (False: one is pending)."""
        return self.updater.start_background(address)

    def take_fetched(self) -> int | None:
        """The version a background update applied (None: not finished); re-raises its
        error (TransportError: fetch failed; VLLMUpdateFailed; VLLMEngineDied)."""
        return self.updater.take_background()

    @property
    def fetch_pending(self) -> bool:
        return self.updater.background_busy

    def close(self) -> None:
        """Stop vLLM's engine core and workers now, rather than at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        self.updater.close()
        try:
            self._loop.run(_shutdown(self.llm))
        finally:
            self._loop.close()
            # drop every reference now: vLLM's __del__ shuts down again, and fails when that
            # happens at interpreter exit
            self.llm = self.updater.llm = None
            gc.collect()


async def _start(args: Any) -> Any:
    return compat.start_engine(args)


async def _shutdown(llm: Any) -> None:
    llm.shutdown()


def _drain(sink: queue.Queue[Finished], timeout_s: float) -> list[Finished]:
    got: list[Finished] = []
    try:
        got.append(sink.get(timeout=timeout_s) if timeout_s > 0 else sink.get_nowait())
    except queue.Empty:
        return got
    while True:
        try:
            got.append(sink.get_nowait())
        except queue.Empty:
            return got


def _raise_error(f: Finished) -> None:
    if f.error is None:
        return
    if compat.is_dead_error(f.error):
        raise VLLMEngineDied(f"vLLM's engine core died: {f.error!r}") from f.error
    raise RuntimeError(f"vLLM request {f.key!r} failed: {f.error!r}") from f.error
