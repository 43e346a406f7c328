"""Teacher engines: the log-prob of every completion token of one group under the teacher.

`logprobs(prompt_ids, completion_ids, offsets, temperature)` returns a float32 array as long
as `completion_ids`: log p_T(o_t | prompt, o_<t) of the tempered teacher, completion by
completion. Two engines: `HFTeacher` (one transformers forward over the group's G sequences,
right-padded, through `grpo_stream.algo.logprobs.token_logprobs`) and `VLLMTeacher` (vLLM's
prompt log-probs of prompt + completion, untempered: it refuses a temperature other than 1).

Invariants: a value per completion token, finite and at most 0, or a `TeacherError` naming
why (a sequence longer than the teacher's context, a non-finite result); never a partial
answer. torch, transformers and vLLM are imported where an engine loads, not at import time.
"""

from __future__ import annotations

import itertools
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import structlog

from grpo_stream.models.loading import (
    load_policy,
    resolve_device,
    resolve_dtype_name,
    resolve_model,
)

log = structlog.get_logger()


class TeacherError(RuntimeError):
    """The teacher cannot score this group; the message says why (one line)."""


class TeacherEngine(Protocol):
    def logprobs(
        self,
        prompt_ids: npt.NDArray[np.int32],
        completion_ids: npt.NDArray[np.int32],
        offsets: npt.NDArray[np.int64],
        temperature: float,
    ) -> npt.NDArray[np.float32]: ...

    def close(self) -> None: ...


def checked(values: npt.NDArray[np.float32], tokens: int) -> npt.NDArray[np.float32]:
    """`values` if it is one finite log-prob (<= 0, up to rounding) per token."""
    if values.shape != (tokens,):
        raise TeacherError(f"teacher gave {values.size} log-probs for {tokens} tokens")
    if not np.all(np.isfinite(values)):
        raise TeacherError("teacher log-probs are not finite (NaN or inf in its logits)")
    return np.minimum(values, 0.0).astype(np.float32)


def sequences(
    prompt_ids: npt.NDArray[np.int32],
    completion_ids: npt.NDArray[np.int32],
    offsets: npt.NDArray[np.int64],
) -> list[tuple[list[int], int]]:
    """(prompt + completion token ids, completion length) of each completion."""
    prompt = [int(t) for t in prompt_ids]
    out = []
    for lo, hi in itertools.pairwise(offsets):
        comp = [int(t) for t in completion_ids[int(lo) : int(hi)]]
        out.append((prompt + comp, len(comp)))
    return out


class HFTeacher:
    """A transformers causal LM, frozen, scoring a group's G sequences in one padded batch."""

    def __init__(self, model: Any, device: str, max_positions: int | None) -> None:
        self.model = model
        self.device = device
        self.max_positions = max_positions

    @classmethod
    def load(cls, path: str, dtype: str = "auto", device: str | None = None) -> HFTeacher:
        dev = resolve_device(device)
        model = load_policy(path, dtype=dtype, device=dev, trainable=False)  # type: ignore[arg-type]
        positions = getattr(model.config, "max_position_embeddings", None)
        log.info("teacher.loaded", engine="hf", model=path, device=dev, positions=positions)
        return cls(model, dev, positions)

    def logprobs(
        self,
        prompt_ids: npt.NDArray[np.int32],
        completion_ids: npt.NDArray[np.int32],
        offsets: npt.NDArray[np.int64],
        temperature: float,
    ) -> npt.NDArray[np.float32]:
        import torch

        from grpo_stream.algo.logprobs import token_logprobs

        rows = sequences(prompt_ids, completion_ids, offsets)
        width = max(len(ids) for ids, _ in rows)
        if self.max_positions is not None and width > self.max_positions:
            raise TeacherError(
                f"a sequence of {width} tokens exceeds the teacher's context "
                f"({self.max_positions} positions)"
            )
        ids = torch.zeros((len(rows), width), dtype=torch.long)  # (G, T) right-padded
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # (G, T)
        completion = torch.zeros((len(rows), width), dtype=torch.bool)  # (G, T)
        for i, (row, n) in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
            completion[i, len(row) - n : len(row)] = True
        with torch.inference_mode():
            logp, _ = token_logprobs(
                self.model,
                ids.to(self.device),
                mask.to(self.device),
                completion.to(self.device),
                chunk=len(rows),
                temperature=temperature,
                with_entropy=False,
            )  # (G, T), 0 outside the completions
        flat = logp.float().cpu()[completion].numpy()  # row-major: completion by completion
        return checked(flat, len(completion_ids))

    def close(self) -> None:
        self.model = None


class VLLMTeacher:
    """vLLM's offline engine: prompt log-probs of prompt + completion (raw, untempered)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    @classmethod
    def load(
        cls,
        path: str,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
    ) -> VLLMTeacher:
        from vllm import LLM

        dev = resolve_device(None)
        resolved = resolve_model(path)
        llm = LLM(
            model=resolved,
            tokenizer=resolved,
            dtype=resolve_dtype_name(dtype, dev),
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enforce_eager=dev.startswith("cpu"),  # CPU: eager is the supported path
            # a cached prefix has no logits to take prompt log-probs from
            enable_prefix_caching=False,
        )
        log.info("teacher.loaded", engine="vllm", model=path, device=dev)
        return cls(llm)

    def logprobs(
        self,
        prompt_ids: npt.NDArray[np.int32],
        completion_ids: npt.NDArray[np.int32],
        offsets: npt.NDArray[np.int64],
        temperature: float,
    ) -> npt.NDArray[np.float32]:
        from vllm import SamplingParams, TokensPrompt

        if temperature != 1.0:
            raise TeacherError(f"the vllm teacher scores at temperature 1, not {temperature}")
        rows = sequences(prompt_ids, completion_ids, offsets)
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in rows]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        values: list[float] = []
        for (ids, n), out in zip(rows, outputs, strict=True):
            per_position = out.prompt_logprobs  # None first, then {token: Logprob} per position
            for t in range(len(ids) - n, len(ids)):
                values.append(float(per_position[t][ids[t]].logprob))
        return checked(np.array(values, dtype=np.float32), len(completion_ids))

    def close(self) -> None:
        self.llm = None


def load_teacher(
    path: str, engine: str, dtype: str, device: str | None, gpu_memory_utilization: float
) -> TeacherEngine:
    """The configured teacher engine, loaded."""
    if engine == "vllm":
        return VLLMTeacher.load(path, dtype, gpu_memory_utilization)
    return HFTeacher.load(path, dtype, device)
