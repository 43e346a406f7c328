"""The rollback guard: an injected NaN restores the last stable state and lowers the lr."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from structlog.testing import capture_logs

from grpo_stream.algo.regularizer import GradRegularizer
from grpo_stream.algo.rollback import RollbackGuard, TooManyRollbacks
from grpo_stream.algo.settings import RegularizerSettings, RollbackSettings

IDS = torch.tensor([[1, 2, 3, 4, 5, 6]])


class Run:
    """A tiny model, AdamW, regularizer and guard, stepped like the trainer does."""

    def __init__(self, model: Any, settings: RollbackSettings | None = None) -> None:
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        self.regularizer = GradRegularizer(RegularizerSettings())
        self.guard = RollbackGuard(settings or RollbackSettings())
        self.step = 0

    def train_step(self, inject_nan: bool = False) -> bool:
        """One step; returns whether it went through (else it was rolled back)."""
        self.step += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model(input_ids=IDS).logits.pow(2).mean()
        if inject_nan:
            loss = loss * math.nan
        loss.backward()
        params = list(self.model.parameters())
        if not self.guard.check(loss, params):
            cause = self.guard.last_cause or "unknown"
            self.guard.rollback(self.model, self.optimizer, self.regularizer, self.step, cause)
            return False
        self.regularizer.apply(params)
        self.optimizer.step()
        self.guard.stable()
        return True

    def snapshot(self) -> None:
        self.guard.snapshot(self.model, self.optimizer, self.regularizer, self.step)

    def params(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]


def test_injected_nan_restores_parameters_and_lowers_lr(tiny_model: Any) -> None:
    run = Run(tiny_model)
    run.train_step()
    run.snapshot()
    stable = run.params()
    stable_avg = [s["exp_avg"].clone() for s in run.optimizer.state.values()]
    run.train_step()  # a good step after the snapshot, then a NaN
    tau_at_failure = run.regularizer.tau
    assert tau_at_failure is not None
    with capture_logs() as logs:
        assert not run.train_step(inject_nan=True)
    for p, s in zip(run.model.parameters(), stable, strict=True):
        assert torch.equal(p.detach(), s) and p.grad is None
    for state, avg in zip(run.optimizer.state.values(), stable_avg, strict=True):
        assert torch.equal(state["exp_avg"], avg)
    assert run.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.8)
    assert run.regularizer.tau == pytest.approx(tau_at_failure * 1.5)
    event = next(e for e in logs if e["event"] == "grpo.rollback")
    assert event["step"] == 3 and event["cause"] == "non_finite_loss"
    assert event["consecutive"] == 1 and event["restored_step"] == 1


def test_check_names_a_non_finite_gradient(tiny_model: Any) -> None:
    guard = RollbackGuard(RollbackSettings())
    params = list(tiny_model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    assert guard.check(torch.tensor(1.0), params)
    grad = params[0].grad
    assert grad is not None
    grad[0].fill_(math.inf)
    assert not guard.check(torch.tensor(1.0), params)
    assert guard.last_cause == "non_finite_grad"


def test_too_many_rollbacks_in_a_row_raise_a_clear_error(tiny_model: Any) -> None:
    run = Run(tiny_model, RollbackSettings(max_consecutive=2))
    run.train_step()
    run.snapshot()
    assert not run.train_step(inject_nan=True)
    assert not run.train_step(inject_nan=True)
    with pytest.raises(TooManyRollbacks, match=r"rollback\.max_consecutive=2"):
        run.train_step(inject_nan=True)


def test_a_stable_step_resets_the_consecutive_count(tiny_model: Any) -> None:
    run = Run(tiny_model, RollbackSettings(max_consecutive=2))
    run.train_step()
    run.snapshot()
    for _ in range(2):
        assert not run.train_step(inject_nan=True)
    assert run.train_step()
    assert run.guard.consecutive == 0
    assert not run.train_step(inject_nan=True)  # allowed again


def test_consecutive_rollbacks_compound_the_lr_reduction(tiny_model: Any) -> None:
    run = Run(tiny_model)
    run.train_step()
    run.snapshot()
    run.train_step(inject_nan=True)
    run.train_step(inject_nan=True)
    assert run.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.8 * 0.8)
    assert run.guard.lr_scale == pytest.approx(0.64)


def test_snapshot_survives_steps_taken_after_a_rollback(tiny_model: Any) -> None:
    run = Run(tiny_model)
    run.train_step()
    run.snapshot()
    stable = run.params()
    stable_avg = [s["exp_avg"].clone() for s in run.optimizer.state.values()]
    run.train_step(inject_nan=True)
    run.train_step()  # the optimizer steps again, in place, from the restored state
    run.train_step(inject_nan=True)
    for p, s in zip(run.model.parameters(), stable, strict=True):
        assert torch.equal(p.detach(), s)
    for state, avg in zip(run.optimizer.state.values(), stable_avg, strict=True):
        assert torch.equal(state["exp_avg"], avg)


def test_snapshot_on_cpu_restores_the_same_state(tiny_model: Any) -> None:
    run = Run(tiny_model, RollbackSettings(snapshot_on_cpu=True))
    run.train_step()
    run.snapshot()
    stable = run.params()
    run.train_step()
    run.train_step(inject_nan=True)
    for p, s in zip(run.model.parameters(), stable, strict=True):
        assert torch.equal(p.detach(), s)


def test_rollback_without_a_snapshot_is_an_error(tiny_model: Any) -> None:
    run = Run(tiny_model)
    with pytest.raises(RuntimeError, match="snapshot"):
        run.train_step(inject_nan=True)
