"""Several optimizer updates per batch (trainer.minibatches) on the real TrainState: K
updates equal K single steps on the row splits with pi_prox fixed at the batch's start, the
clip binds from the second on, the batch stays the unit of step, version and rollback."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from grpo_stream.algo.loss import grpo_loss
from grpo_stream.hub.batches import build_batch
from grpo_stream.training.batch import to_tensors
from grpo_stream.training.minibatches import split_rows
from grpo_stream.training.packing import sequence_logprobs

sys.path.insert(0, str(Path(__file__).parent))
from trainstates import make_group, make_state, params_of, same_params


@pytest.fixture
def state_factory(tmp_path: Path) -> Any:
    count = iter(range(100))

    def factory(*overrides: str) -> Any:
        return make_state(tmp_path / f"run{next(count)}", *overrides)

    return factory


def four_groups(seed: int = 0, **kw: Any) -> list[Any]:
    rng = np.random.default_rng(seed)
    return [make_group(g, rng, **kw) for g in range(4)]  # 16 rows: halves = 2 groups each


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=atol)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_split_rows_gives_contiguous_near_equal_minibatches() -> None:
    rng = np.random.default_rng(0)
    t = to_tensors(build_batch(0, [make_group(g, rng) for g in range(3)]), pad_id=0)  # 12 rows
    parts = split_rows(t, 5)
    assert [p.size for p in parts] == [3, 3, 2, 2, 2]
    assert torch.equal(torch.cat([p.advantages for p in parts]), t.advantages)
    assert len(split_rows(t, 64)) == 12


def test_k_minibatches_equal_k_single_steps_on_the_splits(state_factory: Any) -> None:
    groups = four_groups()
    split = state_factory("trainer.minibatches=2")
    single = state_factory()
    start = params_of(split)
    result = split.train_step(build_batch(0, groups))
    single.train_step(build_batch(0, groups[:2]))
    single.train_step(build_batch(1, groups[2:]))
    assert result.applied and result.metrics["minibatches"] == 2
    assert not same_params(params_of(split), start)
    close(params_of(split), params_of(single))


def test_tis_minibatches_keep_pi_prox_of_the_batch_start(state_factory: Any) -> None:
    """Reference: one single step on the first half; then the tis loss of the second half
    against pi_prox from the START weights (grpo_loss's definition), backward, AdamW."""
    groups = four_groups()
    tis = ['algo.loss.off_policy="tis"', "algo.regularizer.enabled=false", "trainer.lr=3e-2"]
    tis.append("trainer.share_prompts=false")  # the reference below runs the padded forward
    split = state_factory("trainer.minibatches=2", *tis)
    ref, recomputed = state_factory(*tis), state_factory(*tis)
    second = to_tensors(build_batch(1, groups[2:]), pad_id=ref._pad_id())
    with torch.no_grad():
        prox0, _ = sequence_logprobs(ref.model, second, second.size, 1.0, with_entropy=False)
    result = split.train_step(build_batch(0, groups))
    ref.train_step(build_batch(0, groups[:2]))
    ref.optimizer.zero_grad(set_to_none=True)
    logp, _ = sequence_logprobs(ref.model, second, second.size, 1.0, with_entropy=False)
    loss, m = grpo_loss(
        logp,
        second.old_logp,
        second.advantages,
        second.completion_mask,
        ref.cfg.algo.loss,
        max_tokens=8,
        trainer_old_logp=prox0,
    )
    loss.backward()
    ref.optimizer.step()
    recomputed.train_step(build_batch(0, groups[:2]))  # two plain steps: pi_prox moves
    recomputed.train_step(build_batch(1, groups[2:]))
    assert m["ratio_mean"] != pytest.approx(1.0, abs=1e-3)  # pi_theta moved off pi_prox
    assert result.metrics["minibatches"] == 2
    # Adam's steps are ~lr (3e-2) per element; the packed and padded forwards differ by
    # rounding, which Adam's normalisation amplifies on near-zero gradients
    close(params_of(split), params_of(ref), atol=3e-5)
    assert max_diff(params_of(split), params_of(recomputed)) > 1e-3


def test_the_clip_binds_from_the_second_minibatch_with_a_large_lr(state_factory: Any) -> None:
    groups = four_groups()
    for g in groups:
        g.logprobs[:] = -3.0
    one = state_factory('algo.loss.off_policy="tis"', "trainer.lr=5e-2")
    four = state_factory('algo.loss.off_policy="tis"', "trainer.lr=5e-2", "trainer.minibatches=4")
    assert one.train_step(build_batch(0, groups)).metrics["clip_frac"] == 0.0  # r = 1
    start = params_of(four)
    metrics = four.train_step(build_batch(0, groups)).metrics
    assert metrics["clip_frac_later"] > 0.0
    assert not same_params(params_of(four), start)


def test_step_and_version_advance_once_per_batch(state_factory: Any) -> None:
    state = state_factory("trainer.minibatches=3", "trainer.warmup_steps=4")
    result = state.train_step(build_batch(0, four_groups()))
    assert result.metrics["minibatches"] == 3
    assert (state.step, state.version, state.scheduler.last_epoch) == (1, 1, 1)
    assert state.guard.snapshot_step == 1


def test_a_rollback_on_a_later_minibatch_discards_the_whole_batch(state_factory: Any) -> None:
    state = state_factory("trainer.minibatches=2")
    state.train_step(build_batch(0, four_groups(seed=1)))
    before = params_of(state)
    groups = four_groups(seed=2)
    rng = np.random.default_rng(3)
    groups[2:] = [make_group(g, rng, adv_scale=1e21) for g in (2, 3)]  # norm overflows
    result = state.train_step(build_batch(1, groups))
    assert not result.applied and result.metrics["rollback_cause"] == "non_finite_norm"
    assert not result.republish
    assert same_params(params_of(state), before)
    assert (state.step, state.version) == (1, 1)
