"""The real TrainState step: the off-policy correction runs, explosions and overflowing norms
roll back, a rollback keeps the last applied step, and its lr cut survives a resume and
composes with the warmup schedule; the step takes its sampling temperature and its loss
normalisers from the batch (`TrainBatch.sampling`, `TrainBatch.totals`)."""

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
from grpo_stream.protocols.messages import BatchTotals, SamplingParams
from grpo_stream.training.batch import to_tensors

sys.path.insert(0, str(Path(__file__).parent))
from trainstates import make_batch, make_group, make_state, params_of, rolled_back, same_params


@pytest.fixture
def state_factory(tmp_path: Path) -> Any:
    def factory(*overrides: str, resume: bool = False) -> Any:
        return make_state(tmp_path / "run", *overrides, resume=resume)

    return factory


def trainer_logprobs(state: Any, batch: Any, temperature: float = 1.0) -> np.ndarray:
    """The state's log-probs of the batch's completion tokens, flat like behaviour_logprobs."""
    t = to_tensors(batch, pad_id=state._pad_id())
    with torch.no_grad():
        logp, _ = token_logprobs(
            state.model, t.input_ids, t.attention_mask, t.completion_mask, t.size, temperature
        )
    return logp[t.completion_mask].numpy()


def test_tis_caps_far_off_behaviour_weights_at_is_cap(state_factory: Any) -> None:
    far = make_batch(0, logprob=-50.0)  # u = pi_trainer / pi_behaviour ~ e^45: truncated to 2
    a = state_factory('algo.loss.off_policy="tis"', "algo.loss.is_cap=2.0")
    exact = make_batch(0)
    # u = 2 e^0.001 on every token, so it is truncated to exactly 2 as well: a "u = 2" taken from a
    # no-grad forward lands an ulp either side of the cap (the trainer's forward rounds
    # differently on some CPUs), and AdamW's first step amplifies that where |grad| ~ eps
    exact.behaviour_logprobs = trainer_logprobs(a, exact) - math.log(2.0) - 1e-3
    start = params_of(a)
    got = a.train_step(far)
    after_far = params_of(a)
    b = state_factory('algo.loss.off_policy="tis"', "algo.loss.is_cap=2.0")
    assert same_params(params_of(b), start)
    got_exact = b.train_step(exact)
    assert got.metrics["is_trunc_frac"] == 1.0 and got.metrics["is_weight_max"] > 1e15
    assert got_exact.metrics["is_trunc_frac"] == 1.0
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
    weights, moments = rolled_back(state, 3, "exp_avg")
    assert same_params(params_of(state), weights)
    for s, m in zip(state.optimizer.state.values(), moments, strict=True):
        assert torch.equal(s["exp_avg"], m)
    assert (state.step, state.version) == (3, 3)


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


def test_the_rollback_lr_cut_composes_with_the_warmup_schedule(state_factory: Any) -> None:
    state = state_factory("trainer.fault_nan_step=1", "trainer.warmup_steps=4")
    lrs = []
    for seed in range(5):  # steps 0, (1 rolled back), 1, 2, 3
        start = params_of(state)
        result = state.train_step(make_batch(state.step, seed=seed))
        if result.applied:
            assert not same_params(params_of(state), start)
            lrs.append(result.metrics["lr"])
    # LambdaLR's factor min(1, (s + 1) / 4) after s scheduler steps; x 0.8 once rolled back
    expected = [1e-3 * min(1.0, (s + 1) / 4) * (0.8 if s > 1 else 1.0) for s in range(1, 5)]
    assert lrs == pytest.approx(expected)


def test_log_probs_are_taken_at_the_batch_sampling_temperature(state_factory: Any) -> None:
    state = state_factory()  # generator.temperature = 1.0 in its config
    batch = make_batch(0)
    batch.sampling = SamplingParams(temperature=0.5, top_p=1.0, max_tokens=8)
    batch.behaviour_logprobs = trainer_logprobs(state, batch, temperature=0.5)
    at_one = np.abs(trainer_logprobs(state, batch) - batch.behaviour_logprobs).mean()
    metrics = state.train_step(batch).metrics
    assert at_one > 0.1  # had the trainer used its own config, the gap would be this large
    assert metrics["logp_gap"] == pytest.approx(0.0, abs=1e-5)


def test_a_batch_whose_totals_are_not_its_own_is_refused_on_one_rank(
    state_factory: Any,
) -> None:
    state = state_factory()
    batch = make_batch(0)
    batch.totals = BatchTotals(batch.totals.num_seqs * 2, batch.totals.num_tokens * 2)
    start = params_of(state)
    with pytest.raises(ValueError, match=r"TrainBatch\.totals"):
        state.train_step(batch)
    assert same_params(params_of(state), start)


def test_totals_smaller_than_the_shard_are_refused_on_any_rank(state_factory: Any) -> None:
    state = state_factory()
    state.world_size = 2  # a shard of a two-rank step (no process group needed to refuse)
    batch = make_batch(0)
    batch.totals = BatchTotals(batch.totals.num_seqs - 1, batch.totals.num_tokens)
    with pytest.raises(ValueError, match="cannot be the step's"):
        state.train_step(batch)


def test_each_rank_normalises_by_the_whole_steps_totals(state_factory: Any) -> None:
    """A rank holding a quarter of a two-rank step normalises by the step's totals / 2, so its
    loss over these sequences is half what one process gets from them alone."""
    single, shard = state_factory(), state_factory()
    batch = make_batch(0)
    quarter = make_batch(0)
    quarter.totals = BatchTotals(batch.totals.num_seqs * 4, batch.totals.num_tokens * 4)
    shard.world_size = 2
    loss_single = single.train_step(batch).metrics["loss"]
    loss_shard = shard.train_step(quarter).metrics["loss"]
    assert loss_shard == pytest.approx(loss_single / 2, rel=1e-5)
