"""Atomic checkpoints: complete ones are found, partial ones ignored, old ones pruned."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2LMHeadModel

from grpo_stream.models.testing import tiny_gpt2
from grpo_stream.training.checkpoint import (
    MARKER,
    complete_checkpoints,
    latest_checkpoint,
    load_trainer_state,
    save_checkpoint,
    set_rng_state,
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
