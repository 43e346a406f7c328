"""The vllm teacher (prompt log-probs of prompt + completion) against the hf teacher's forward
on the same saved model. Needs vLLM: run on the CPU build with
`LD_PRELOAD=$VIRTUAL_ENV/lib/libiomp5.so pytest -m gpu tests/unit/engines`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def vllm_teacher(tiny_dir: Path) -> Iterator[Any]:
    pytest.importorskip("vllm")
    from grpo_stream.engines.distill import VLLMTeacher

    on_gpu = torch.cuda.is_available()
    teacher = VLLMTeacher.load(
        str(tiny_dir),
        dtype="auto" if on_gpu else "float32",
        gpu_memory_utilization=0.2 if on_gpu else 0.1,
        max_model_len=64,
    )
    yield teacher
    teacher.close()


def test_vllm_teacher_log_probs_match_the_hf_teacher(vllm_teacher: Any, tiny_dir: Path) -> None:
    from grpo_stream.engines.distill import HFTeacher

    hf = HFTeacher.load(str(tiny_dir), dtype="float32", device="cpu")
    prompt = np.array([5, 6, 17, 7, 15], np.int32)  # "1+2=" in the fixture's characters
    completions = [[5, 6, 1], [9], [12, 13, 14, 1]]
    flat = np.array([t for c in completions for t in c], np.int32)
    offsets = np.cumsum([0] + [len(c) for c in completions]).astype(np.int64)
    got = vllm_teacher.logprobs(prompt, flat, offsets, 1.0)
    want = hf.logprobs(prompt, flat, offsets, 1.0)
    np.testing.assert_allclose(got, want, atol=2e-3 if torch.cuda.is_available() else 1e-4)


def test_vllm_teacher_refuses_a_temperature_it_cannot_apply(vllm_teacher: Any) -> None:
    from grpo_stream.engines.distill import TeacherError

    with pytest.raises(TeacherError, match="temperature 1"):
        vllm_teacher.logprobs(np.array([5], np.int32), np.array([6], np.int32),
                              np.array([0, 1]), 0.7)  # fmt: skip
