"""Mixed precision on the CPU (CPU autocast): bf16-mixed matches fp32 within a stated
tolerance, log-probs and loss stay float32, an fp16 overflow is a skipped step (no rollback).

Tolerance of bf16-mixed against fp32 (bf16 has an 8-bit mantissa, relative rounding 2^-9 per
op): loss within 2% relative; the whole gradient within 10% in norm of the difference over
the norm, with cosine similarity >= 0.99.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from grpo_stream.config import load_config
from grpo_stream.hub.batches import build_batch
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.messages import SamplingParams, TrainBatch
from grpo_stream.training.batch import to_tensors
from grpo_stream.training.packing import sequence_logprobs


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _batch() -> TrainBatch:
    rng = np.random.default_rng(3)
    groups = []
    for gid in range(4):
        lengths = rng.integers(2, 9, size=4)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        rewards = rng.random(4).astype(np.float32)
        groups.append(
            Group(
                group_id=gid,
                policy_version=0,
                prompt_ids=rng.integers(3, 20, size=5).astype(np.int32),
                completion_ids=rng.integers(3, 20, size=int(offsets[-1])).astype(np.int32),
                completion_offsets=offsets,
                logprobs=(-rng.random(int(offsets[-1])) - 1.0).astype(np.float32),
                rewards=rewards,
                advantages=((rewards - rewards.mean()) / (rewards.std() + 1e-4)).astype(np.float32),
                valid=np.ones(4, dtype=bool),
                sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
            )
        )
    return build_batch(1, groups)


def _state(tmp_path: Path, precision: str, *extra: str) -> Any:
    from grpo_stream.training.state import TrainState

    cfg = load_config(
        None,
        [
            f"run.run_dir={json.dumps(str(tmp_path / precision))}",
            f'trainer.precision="{precision}"',
            *extra,
        ],
    )
    return TrainState.create(cfg)


def _loss_and_grads(state: Any, batch: TrainBatch) -> tuple[float, torch.Tensor]:
    state.optimizer.zero_grad(set_to_none=True)
    loss, _ = state._forward_backward(to_tensors(batch, state._pad_id()), batch)
    assert loss.dtype == torch.float32
    grads = [p.grad.flatten() for p in state.model.parameters() if p.grad is not None]
    return float(loss), torch.cat(grads)


def test_bf16_mixed_loss_and_gradients_match_fp32(tmp_path: Path) -> None:
    batch = _batch()
    loss32, g32 = _loss_and_grads(_state(tmp_path, "fp32"), batch)
    mixed = _state(tmp_path, "bf16-mixed")
    assert next(mixed.model.parameters()).dtype == torch.float32  # fp32 master weights
    loss16, g16 = _loss_and_grads(mixed, batch)
    assert abs(loss16 - loss32) <= 0.02 * abs(loss32)
    assert float((g16 - g32).norm() / g32.norm()) <= 0.10
    assert float(torch.nn.functional.cosine_similarity(g16, g32, dim=0)) >= 0.99
    assert not torch.equal(g16, g32)  # autocast did run in bf16


def test_log_probs_are_float32_under_bf16_autocast(tmp_path: Path) -> None:
    state = _state(tmp_path, "bf16-mixed")
    part = state._micro_batches(to_tensors(_batch(), state._pad_id()))[0]
    with state.precision.autocast():
        logp, entropy = sequence_logprobs(state.model, part, chunk=4, temperature=1.0)
    assert logp.dtype == torch.float32 and entropy.dtype == torch.float32


def test_fp16_overflow_skips_the_step_without_a_rollback(tmp_path: Path) -> None:
    state = _state(tmp_path, "fp16-mixed")
    assert state.precision.scaler is not None
    # a loss scale so large that the scaled fp16 gradients overflow
    state.precision.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**120)
    before = [p.detach().clone() for p in state.model.parameters()]
    result = state.train_step(_batch())
    assert not result.applied
    assert result.metrics["overflow_skips"] == 1
    assert state.guard.total == 0 and state.step == 0 and state.version == 0
    assert all(torch.equal(b, p) for b, p in zip(before, state.model.parameters(), strict=True))
    assert state.precision.scaler.get_scale() < 2.0**120  # the scale shrank


def test_fp16_mixed_applies_a_finite_step(tmp_path: Path) -> None:
    state = _state(tmp_path, "fp16-mixed")
    before = [p.detach().clone() for p in state.model.parameters()]
    assert state.train_step(_batch()).applied
    assert any(not torch.equal(b, p) for b, p in zip(before, state.model.parameters(), strict=True))
