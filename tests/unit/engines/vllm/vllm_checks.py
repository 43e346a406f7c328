"""Checks the vLLM tests share: behaviour log-probs against a transformers forward, a
perturbed copy of a model (a new weights version), and finding a vLLM worker process."""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from grpo_stream.sampling import GroupSample

sys.path.insert(0, str(Path(__file__).parents[1] / "reference"))  # not engines/ (see test_hf)
from teacher_forced import teacher_forced_logprobs


def logprob_errors(prompt_ids: list[int], token_ids: list[int], logprobs: list[float],
                   model: Any, temperature: float = 1.0) -> list[float]:  # fmt: skip
    """|engine log-prob - teacher-forced log_softmax(logits / T)| per completion token."""
    expected = teacher_forced_logprobs(model, prompt_ids, token_ids, temperature)
    return [abs(e - lp) for e, lp in zip(expected, logprobs, strict=True)]


def max_logprob_error(groups: list[GroupSample], model: Any, temperature: float = 1.0) -> float:
    return max(
        max(logprob_errors(g.prompt_ids, c.token_ids, c.logprobs, model, temperature))
        for g in groups
        for c in g.completions
    )


def perturbed_copy(model: Any, seed: int) -> Any:
    """A copy of `model` with every parameter (the tied embedding too) moved a little."""
    new = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return new


def vllm_worker_of(pid: int, timeout_s: float = 300) -> psutil.Process:
    """The live vLLM worker process under `pid` (its engine core's child), once it exists.
    Engines closed earlier in the same process may linger as zombies: those are skipped."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in psutil.Process(pid).children(recursive=True):
            try:
                named = "Worker" in proc.name() or any("Worker" in a for a in proc.cmdline())
                if named and proc.status() != psutil.STATUS_ZOMBIE:
                    return proc
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.5)
    raise AssertionError(f"no vLLM worker under pid {pid}")
