"""Atomic checkpoints: complete ones are found, partial ones ignored, old ones pruned."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import GPT2LMHeadModel

from grpo_stream.models.testing import tiny_gpt2
from grpo_stream.rng import set_rng_state
from grpo_stream.training.checkpoint import (
    MARKER,
    complete_checkpoints,
    latest_checkpoint,
    load_trainer_state,
    save_checkpoint,
)


def _model() -> Any:
    return tiny_gpt2(vocab=32, positions=16)


def test_save_then_load_round_trips_state_and_rng(tmp_path: Path) -> None:
    model = _model()
    path = save_checkpoint(
        tmp_path, 3, model, None, {"step": 3, "opt": {"x": torch.ones(2)}}, keep=2
    )
    assert (path / MARKER).exists() and latest_checkpoint(tmp_path) == path
    expected = random.random()
    state = load_trainer_state(path)
    set_rng_state(state["rng"])
    assert state["step"] == 3 and torch.equal(state["opt"]["x"], torch.ones(2))
    assert random.random() == expected


def test_partial_checkpoint_is_ignored(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, _model(), None, {"step": 1}, keep=3)
    partial = tmp_path / "checkpoints" / "step-2"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-1"


def test_only_the_newest_are_kept(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, _model(), None, {"step": step}, keep=2)
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [2, 3]


def test_checkpoint_loads_with_transformers(tmp_path: Path) -> None:
    model = _model()
    path = save_checkpoint(tmp_path, 5, model, None, {"step": 5}, keep=1)
    loaded = GPT2LMHeadModel.from_pretrained(path)
    assert torch.equal(loaded.transformer.wte.weight, model.transformer.wte.weight)


class _FakeCuda:
    """torch.cuda at its boundary: an initialised device whose generator state is 16 bytes."""

    def __init__(self, state: torch.Tensor) -> None:
        self.state = state
        self.restored: list[torch.Tensor] = []

    def install(self, monkeypatch: pytest.MonkeyPatch, available: bool = True) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: available)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": self.state)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.restored.append)


def test_a_gpu_trainers_checkpoint_keeps_and_restores_its_cuda_rng(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model()
    cuda = _FakeCuda(torch.arange(16, dtype=torch.uint8))
    cuda.install(monkeypatch)
    path = save_checkpoint(tmp_path, 1, model, None, {"step": 1}, keep=1)
    state = load_trainer_state(path)  # weights_only: the CUDA state loads as a plain tensor
    assert torch.equal(state["rng"]["cuda"], cuda.state)
    set_rng_state(state["rng"])
    assert len(cuda.restored) == 1 and torch.equal(cuda.restored[0], cuda.state)


def test_a_cuda_rng_state_is_left_alone_where_cuda_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = _FakeCuda(torch.arange(16, dtype=torch.uint8))
    cuda.install(monkeypatch)
    path = save_checkpoint(tmp_path, 1, _model(), None, {"step": 1}, keep=1)
    cuda.install(monkeypatch, available=False)  # resumed on a CPU host
    expected = random.random()
    set_rng_state(load_trainer_state(path)["rng"])
    assert random.random() == expected and cuda.restored == []


def test_a_cpu_process_saves_no_cuda_rng(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 1, _model(), None, {"step": 1}, keep=1)
    assert "cuda" not in load_trainer_state(path)["rng"]
