"""The vLLM engine: `vllm.LLM` with a worker extension that swaps weights in place.

Invariants (see `grpo_stream.engines.base` for the completion conventions):

- Sampling is `SamplingParams(n=G, temperature, top_p, logprobs=0)` with no top-k, and the
  model's generation_config is ignored (`generation_config="vllm"`), so no default top_k or
  penalty sneaks in. `logprobs_mode="processed_logprobs"` makes vLLM report log-probs of the
  distribution it sampled from (after temperature; after top-p too when top_p < 1), i.e.
  `log_softmax(logits / temperature)` at top_p = 1, the same numbers the hf engine reports.
- vLLM keeps the end-of-sequence token in `token_ids` (not in `text`); `finish_reason ==
  "length"` marks a truncated completion.
- With a `seed`, every prompt gets its own request seed derived from it (vLLM gives the n
  samples of one request seeds seed+i), so equal inputs and seed give equal outputs.
- `complete` (episodes, `grpo_stream.envs.episodes`) feeds each row of token ids to vLLM as a
  `TokensPrompt`, never re-tokenized, one request (n=1) per row. Automatic prefix caching is
  on, so a turn reuses the KV blocks its episode's earlier turns computed; vLLM caches whole
  blocks only (`generator.vllm_block_size` tokens), so the reused prefix is the row's longest
  cached run of full blocks. `last_cached_tokens` says, per row of the last call, how many
  prompt tokens vLLM served from the cache (its `RequestOutput.num_cached_tokens`).
- Weight updates run inside vLLM's workers (`vllm_worker.WeightSyncExtension`); after each
  the prefix cache is reset, so no cached prefix computed with old weights is reused.

vLLM is imported inside functions only: importing this module never needs it.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from grpo_stream.engines.base import (
    Completion,
    GroupSample,
    resolve_device,
    resolve_dtype_name,
    to_torch,
)
from grpo_stream.progress import long_wait
from grpo_stream.transport.settings import SecuritySettings, TransportSettings

if TYPE_CHECKING:
    import numpy as np
    import torch

    from grpo_stream.config import GeneratorSettings, ModelSettings
    from grpo_stream.models.adapter import LoraSettings

log = structlog.get_logger()

WORKER_EXTENSION = "grpo_stream.engines.vllm_worker.WeightSyncExtension"


class VLLMEngine:
    """Samples groups of completions with a `vllm.LLM` held in this process."""

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        transport: TransportSettings | None = None,
        security: SecuritySettings | None = None,
        version: int = 0,
    ) -> None:
        self.llm = llm
        self.tokenizer = tokenizer  # the trainer's (models.loading): episodes tokenize with it
        self.version = version
        self.last_cached_tokens: list[int] = []
        self._transport = transport or TransportSettings()
        self._security = security or SecuritySettings()
        self._lora: Any = None  # engines.lora.VLLMAdapter when serving LoRA adapter versions

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
    ) -> VLLMEngine:
        """Start vLLM on `model.name_or_path` (`device` only picks the dtype for "auto").
        With `lora` enabled, vLLM serves each published adapter version as a LoRARequest."""
        from vllm import LLM

        from grpo_stream.models.loading import load_tokenizer, resolve_model

        dev = resolve_device(device)
        path = resolve_model(model.name_or_path)
        lora_args: dict[str, Any] = {}
        if lora is not None and lora.enabled:
            from grpo_stream.engines.lora import vllm_lora_args

            lora_args = vllm_lora_args(lora)
        with long_wait("model.load", engine="vllm", model=model.name_or_path):
            llm = LLM(
                model=path,
                tokenizer=path,
                dtype=resolve_dtype_name(model.dtype, dev),
                seed=seed,
                gpu_memory_utilization=generator.gpu_memory_utilization,
                tensor_parallel_size=generator.tensor_parallel,  # the GPUs placement gave it
                max_model_len=max_model_len,
                # CUDA graphs pay off on GPUs; on the CPU eager mode is the supported path.
                enforce_eager=dev.startswith("cpu"),
                worker_extension_cls=WORKER_EXTENSION,
                logprobs_mode="processed_logprobs",
                generation_config="vllm",
                enable_prefix_caching=True,  # episodes: each turn reuses its prefix's KV
                block_size=generator.vllm_block_size,  # None: vLLM's default
                **lora_args,
            )
        log.info("engine.loaded", engine="vllm", model=model.name_or_path, device=dev)
        engine = cls(llm, load_tokenizer(model.name_or_path), transport, security)
        if lora_args:
            from grpo_stream.engines.lora import VLLMAdapter

            engine._lora = VLLMAdapter(llm, path, model.name_or_path)
        return engine

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
        from vllm import SamplingParams

        if not prompts:
            raise ValueError("generate needs at least one prompt")
        rng = random.Random(seed) if seed is not None else None
        params = [
            SamplingParams(
                n=group_size,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                logprobs=0,
                seed=None if rng is None else rng.getrandbits(31),
            )
            for _ in prompts
        ]
        start = time.perf_counter()
        adapter = None if self._lora is None else self._lora.request  # None: the base model
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=adapter)
        groups = [_group(out) for out in outputs]
        tokens = sum(len(c.token_ids) for g in groups for c in g.completions)
        seconds = time.perf_counter() - start
        log.debug(
            "engine.generated",
            prompts=len(prompts),
            group_size=group_size,
            tokens=tokens,
            seconds=round(seconds, 4),
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
        as given (the multi-turn path); rows sharing a cached prefix reuse its KV blocks."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not rows or any(not r for r in rows):
            raise ValueError("complete needs non-empty rows of token ids")
        rng = random.Random(seed) if seed is not None else None
        params = [
            SamplingParams(
                n=1,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                logprobs=0,
                seed=None if rng is None else rng.getrandbits(31),
                detokenize=False,  # the text is decoded below as the hf engine decodes it
            )
            for _ in rows
        ]
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in row]) for row in rows]
        start = time.perf_counter()
        adapter = None if self._lora is None else self._lora.request
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=adapter)
        completions = [_completion(out.outputs[0], self.tokenizer) for out in outputs]
        self.last_cached_tokens = [int(out.num_cached_tokens or 0) for out in outputs]
        log.debug(
            "engine.completed",
            rows=len(rows),
            prompt_tokens=sum(len(r) for r in rows),
            cached_tokens=sum(self.last_cached_tokens),
            tokens=sum(len(c.token_ids) for c in completions),
            seconds=round(time.perf_counter() - start, 4),
            version=self.version,
        )
        return completions

    def load_weights(
        self, named: Iterable[tuple[str, torch.Tensor | np.ndarray]], version: int
    ) -> None:
        """Apply a complete version: written to a safetensors file the workers read."""
        from safetensors.torch import save_file

        tensors: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for name, value in named:
            tensor = to_torch(value)
            if tensor.data_ptr() in seen:  # a tied alias: safetensors refuses shared storage
                continue
            seen.add(tensor.data_ptr())
            tensors[name] = tensor.detach().cpu().contiguous()
        with tempfile.TemporaryDirectory(prefix="grpo-weights-") as tmp:
            path = Path(tmp) / f"v{version}.safetensors"
            save_file(tensors, str(path))
            self.llm.collective_rpc("load_weights_file", args=(str(path),))
        self._after_update(version)

    def update_from_server(self, address: str, version: int) -> int:
        """Every worker fetches `version` (-1: newest) itself and applies it; the version got.
        LoRA: this process fetches the (small) adapter and hands it to vLLM instead."""
        if self._lora is not None:
            from grpo_stream.engines.lora import fetch_adapter

            version_got, manifest, tensors = fetch_adapter(
                address, version, self._transport, self._security
            )
            self._lora.apply(manifest, tensors, version_got)
            self._after_update(version_got)
            return self.version
        got = self.llm.collective_rpc(
            "update_from_server",
            args=(
                address,
                version,
                self._transport.model_dump(mode="json"),
                self._security.model_dump(mode="json"),
            ),
        )
        if len(set(got)) != 1:
            raise RuntimeError(f"vLLM workers applied different weight versions: {got}")
        self._after_update(int(got[0]))
        return self.version

    def _after_update(self, version: int) -> None:
        self.llm.reset_prefix_cache()
        self.version = version
        log.info("engine.weights_loaded", engine="vllm", version=version)

    def close(self) -> None:
        """Stop vLLM's engine-core process and workers now, rather than at interpreter exit."""
        import gc

        if self.llm is None:
            return
        try:
            self.llm.llm_engine.engine_core.shutdown()
        except AttributeError:  # another vLLM layout: collection shuts it down instead
            log.info("engine.vllm_shutdown_by_gc")
        self.llm = None
        gc.collect()


def _group(out: Any) -> GroupSample:
    """One vLLM RequestOutput as a GroupSample."""
    completions = [_completion(comp) for comp in out.outputs]
    return GroupSample(prompt_ids=[int(t) for t in out.prompt_token_ids], completions=completions)


def _completion(comp: Any, tokenizer: Any = None) -> Completion:
    """One vLLM CompletionOutput as a Completion (the sampled token's log-prob per position);
    with `tokenizer`, the text is its decoding of the ids (special tokens skipped), not vLLM's."""
    ids = [int(t) for t in comp.token_ids]
    logprobs = [float(pos[t].logprob) for t, pos in zip(ids, comp.logprobs, strict=True)]
    text = comp.text if tokenizer is None else tokenizer.decode(ids, skip_special_tokens=True)
    return Completion(
        token_ids=ids, logprobs=logprobs, text=text, truncated=comp.finish_reason == "length"
    )
