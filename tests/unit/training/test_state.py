"""The real TrainState step: the off-policy correction runs, explosions and overflowing norms
roll back, a rollback keeps the last applied step, and its lr cut survives a resume."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from grpo_stream.algo.logprobs import token_logprobs
from grpo_stream.hub.batches import build_batch
from grpo_stream.training.batch import to_tensors

sys.path.insert(0, str(Path(__file__).parent))
from trainstates import make_batch, make_group, make_state, params_of, same_params


@pytest.fixture
def state_factory(tmp_path: Path) -> Any:
    def factory(*overrides: str, resume: bool = False) -> Any:
        return make_state(tmp_path / "run", *overrides, resume=resume)

    return factory


def trainer_logprobs(state: Any, batch: Any) -> np.ndarray:
    """The state's log-probs of the batch's completion tokens, flat like behaviour_logprobs."""
    t = to_tensors(batch, pad_id=state._pad_id())
    with torch.no_grad():
        logp, _ = token_logprobs(
            state.model, t.input_ids, t.attention_mask, t.completion_mask, t.size
        )
    return logp[t.completion_mask].numpy()


def test_tis_caps_far_off_behaviour_weights_at_is_cap(state_factory: Any) -> None:
    far = make_batch(0, logprob=-50.0)  # u = pi_trainer / pi_behaviour ~ e^45: truncated to 2
    a = state_factory('algo.loss.off_policy="tis"', "algo.loss.is_cap=2.0")
    exact = make_batch(0)
    exact.behaviour_logprobs = trainer_logprobs(a, exact) - math.log(2.0)  # u = 2 exactly
    start = params_of(a)
    got = a.train_step(far)
    after_far = params_of(a)
    b = state_factory('algo.loss.off_policy="tis"', "algo.loss.is_cap=2.0")
    assert same_params(params_of(b), start)
    b.train_step(exact)
    assert got.metrics["is_trunc_frac"] == 1.0 and got.metrics["is_weight_max"] > 1e15
    assert not same_params(after_far, start)
    for name, p in b.model.named_parameters():
        torch.testing.assert_close(p.detach(), after_far[name], rtol=1e-4, atol=2e-5)


def test_decoupled_drops_tokens_over_the_cap_so_nothing_moves(state_factory: Any) -> None:
    state = state_factory('algo.loss.off_policy="decoupled"')
    start = params_of(state)
    result = state.train_step(make_batch(0, logprob=-50.0))
    assert result.applied and result.metrics["is_trunc_frac"] == 1.0
    assert same_params(params_of(state), start)


def test_log_prob_gap_is_reported_per_staleness(state_factory: Any) -> None:
    state = state_factory()
    state.version = 3
    rng = np.random.default_rng(0)
    groups = [make_group(0, rng, version=3), make_group(1, rng, version=1)]
    batch = build_batch(0, groups)
    exact = trainer_logprobs(state, batch)
    n0 = int(groups[0].completion_offsets[-1])
    shift = np.concatenate([np.full(n0, 0.1), np.full(len(exact) - n0, -0.5)])
    batch.behaviour_logprobs = (exact + shift).astype(np.float32)
    m = state.train_step(batch).metrics
    assert m["logp_gap_stale0"] == pytest.approx(0.1, abs=1e-4)
    assert m["logp_gap_stale2"] == pytest.approx(0.5, abs=1e-4)
    assert m["is_weight_max"] == pytest.approx(math.exp(0.5), rel=1e-4)


def test_an_exploding_norm_is_skipped_rolled_back_and_counted(state_factory: Any) -> None:
    state = state_factory("algo.regularizer.explode_after=1")
    assert state.train_step(make_batch(0)).applied
    before = params_of(state)
    result = state.train_step(make_batch(1, seed=1, adv_scale=1e4))
    assert not result.applied and result.metrics["rollback_cause"] == "explosion"
    assert same_params(params_of(state), before)
    assert state.guard.explosions == 1 and state.step == 1
    assert state.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.8)


def test_a_norm_that_overflows_float32_rolls_back(state_factory: Any) -> None:
    state = state_factory()
    assert state.train_step(make_batch(0)).applied
    before = params_of(state)
    result = state.train_step(make_batch(1, seed=1, adv_scale=1e21))  # finite gradients
    assert not result.applied and result.metrics["rollback_cause"] == "non_finite_norm"
    assert same_params(params_of(state), before)
    for moments in state.optimizer.state.values():
        assert float(moments["exp_avg_sq"].max()) < 1e10


def test_rollback_restores_the_last_applied_step(state_factory: Any) -> None:
    state = state_factory("trainer.fault_nan_step=3")
    for step in range(3):
        assert state.train_step(make_batch(step, seed=step)).applied
    weights = params_of(state)
    moments = [s["exp_avg"].clone() for s in state.optimizer.state.values()]
    result = state.train_step(make_batch(3, seed=3))
    assert not result.applied and result.metrics["rollback_cause"] == "non_finite_loss"
    assert same_params(params_of(state), weights)
    for s, m in zip(state.optimizer.state.values(), moments, strict=True):
        assert torch.equal(s["exp_avg"], m)
    assert (state.step, state.version, result.republish) == (3, 3, False)


def test_older_restore_point_is_published_as_a_new_version(state_factory: Any) -> None:
    state = state_factory(
        "trainer.fault_nan_step=3", "algo.rollback.snapshot_every=2", "trainer.warmup_steps=10"
    )
    for step in range(2):
        state.train_step(make_batch(step, seed=step))
    at_two = params_of(state)
    state.train_step(make_batch(2, seed=2))
    result = state.train_step(make_batch(3, seed=3))
    assert not result.applied and result.republish
    assert same_params(params_of(state), at_two)
    assert state.scheduler.last_epoch == 2  # the schedule of the restored weights
    assert (state.step, state.version) == (3, 4)  # the version never goes back


def test_rollback_lr_cut_survives_a_resume(state_factory: Any) -> None:
    state = state_factory("trainer.fault_nan_step=1")
    state.train_step(make_batch(0))
    assert not state.train_step(make_batch(1, seed=1)).applied
    state.train_step(make_batch(1, seed=2))
    assert state.optimizer.param_groups[0]["lr"] == pytest.approx(8e-4)
    state.checkpoint()
    resumed = state_factory(resume=True)
    assert resumed.step == 2 and resumed.guard.total == 1
    resumed.train_step(make_batch(2, seed=3))
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(8e-4)
