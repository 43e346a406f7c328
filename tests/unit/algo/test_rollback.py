"""The rollback guard on its own: what `check` finds, what `rollback` restores (model,
optimizer moments, scheduler, regularizer, RNG), lr and tau responses, limits. The guard
inside the real train step is tested in tests/unit/training/test_state.py."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from structlog.testing import capture_logs

from grpo_stream.algo.regularizer import GradRegularizer
from grpo_stream.algo.rollback import RollbackGuard, TooManyRollbacks
from grpo_stream.config.algo import RegularizerSettings, RollbackSettings

IDS = torch.tensor([[1, 2, 3, 4, 5, 6]])


class Parts:
    """Model, AdamW, scheduler, regularizer and guard: what the guard saves and restores."""

    def __init__(self, model: Any, settings: RollbackSettings | None = None) -> None:
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0)
        self.regularizer = GradRegularizer(RegularizerSettings(tau0=1.0))
        self.guard = RollbackGuard(settings or RollbackSettings())

    def move(self) -> None:
        """Change weights, moments, schedule, tau and the RNG (any update would)."""
        self.optimizer.zero_grad()
        self.model(input_ids=IDS).logits.pow(2).mean().backward()
        self.optimizer.step()
        self.scheduler.step()
        self.regularizer.tau = 7.0
        torch.rand(3)

    def snapshot(self, step: int) -> None:
        self.guard.snapshot(self, step)

    def rollback(self, step: int) -> None:
        self.guard.rollback(self, step, "non_finite_loss")


def clone_params(model: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_rollback_restores_model_moments_schedule_and_rng(tiny_model: Any) -> None:
    parts = Parts(tiny_model)
    parts.move()
    parts.snapshot(step=1)
    weights = clone_params(tiny_model)
    moments = [s["exp_avg_sq"].clone() for s in parts.optimizer.state.values()]
    draw = torch.rand(3)  # what the RNG gives next from the snapshot
    parts.move()
    parts.move()
    with capture_logs() as logs:
        parts.rollback(step=3)
    for p, w in zip(tiny_model.parameters(), weights, strict=True):
        assert torch.equal(p.detach(), w) and p.grad is None
    for s, m in zip(parts.optimizer.state.values(), moments, strict=True):
        assert torch.equal(s["exp_avg_sq"], m)
    assert parts.scheduler.last_epoch == 1
    assert torch.equal(torch.rand(3), draw)
    assert parts.guard.restores_weights
    event = next(e for e in logs if e["event"] == "grpo.rollback")
    assert event["restored_step"] == 1 and event["cause"] == "non_finite_loss"


def test_rollback_to_the_current_step_does_not_restore_weights(tiny_model: Any) -> None:
    parts = Parts(tiny_model)
    parts.move()
    parts.snapshot(step=1)
    parts.rollback(step=1)
    assert not parts.guard.restores_weights


def test_rollback_lowers_the_lr_and_raises_tau_as_they_were_at_the_failure(
    tiny_model: Any,
) -> None:
    parts = Parts(tiny_model)
    parts.snapshot(step=0)
    parts.move()  # tau 7 at the failure
    parts.rollback(step=1)
    parts.rollback(step=1)
    assert parts.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.8 * 0.8)
    assert parts.guard.lr_scale == pytest.approx(0.64)
    assert parts.regularizer.tau == pytest.approx(7.0 * 1.5 * 1.5)


def test_after_step_takes_the_restore_point_every_snapshot_every_steps(tiny_model: Any) -> None:
    parts = Parts(tiny_model, RollbackSettings(snapshot_every=3))
    parts.snapshot(step=0)
    for step in range(1, 6):
        parts.guard.after_step(parts, step)
    assert parts.guard.snapshot_step == 3


def test_rollback_count_round_trips_through_state_dict() -> None:
    guard = RollbackGuard(RollbackSettings())
    guard.total, guard.explosions = 3, 1
    other = RollbackGuard(RollbackSettings())
    other.load_state_dict(guard.state_dict())
    assert other.lr_scale == pytest.approx(0.8**3) and other.explosions == 1


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
    parts = Parts(tiny_model, RollbackSettings(max_consecutive=2))
    parts.snapshot(step=0)
    parts.rollback(step=0)
    parts.rollback(step=0)
    with pytest.raises(TooManyRollbacks, match=r"rollback\.max_consecutive=2"):
        parts.rollback(step=0)


def test_a_stable_step_resets_the_consecutive_count(tiny_model: Any) -> None:
    parts = Parts(tiny_model, RollbackSettings(max_consecutive=2))
    parts.snapshot(step=0)
    parts.rollback(step=0)
    parts.rollback(step=0)
    parts.guard.stable()
    assert parts.guard.consecutive == 0
    parts.rollback(step=0)  # allowed again


def test_snapshot_survives_steps_taken_after_a_rollback(tiny_model: Any) -> None:
    parts = Parts(tiny_model)
    parts.move()
    parts.snapshot(step=1)
    weights = clone_params(tiny_model)
    parts.rollback(step=1)
    parts.move()  # the optimizer steps again, in place, from the restored state
    parts.rollback(step=2)
    for p, w in zip(tiny_model.parameters(), weights, strict=True):
        assert torch.equal(p.detach(), w)


def test_snapshot_on_the_parameters_device_restores_the_same_state(tiny_model: Any) -> None:
    parts = Parts(tiny_model, RollbackSettings(snapshot_on_cpu=False))
    parts.snapshot(step=0)
    weights = clone_params(tiny_model)
    parts.move()
    parts.rollback(step=1)
    for p, w in zip(tiny_model.parameters(), weights, strict=True):
        assert torch.equal(p.detach(), w)


def test_rollback_without_a_snapshot_is_an_error(tiny_model: Any) -> None:
    parts = Parts(tiny_model)
    with pytest.raises(RuntimeError, match="snapshot"):
        parts.rollback(step=0)


def test_a_new_snapshot_reuses_the_previous_snapshots_tensors(tiny_model: Any) -> None:
    parts = Parts(tiny_model)
    parts.move()
    parts.snapshot(step=1)
    first = parts.guard._snap
    assert first is not None
    pointers = [t.data_ptr() for t in first.model.values()]
    moment_ptrs = [s["exp_avg"].data_ptr() for s in first.optimizer["state"].values()]
    parts.move()
    parts.snapshot(step=2)  # restore point 2: same buffers, step 2's values
    second = parts.guard._snap
    assert second is not None
    assert [t.data_ptr() for t in second.model.values()] == pointers
    assert [s["exp_avg"].data_ptr() for s in second.optimizer["state"].values()] == moment_ptrs
    weights = clone_params(tiny_model)
    moments = [s["exp_avg"].clone() for s in parts.optimizer.state.values()]
    parts.move()
    parts.rollback(step=3)
    for p, w in zip(tiny_model.parameters(), weights, strict=True):
        assert torch.equal(p.detach(), w)
    for s, m in zip(parts.optimizer.state.values(), moments, strict=True):
        assert torch.equal(s["exp_avg"], m)


def _bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_snapshot_of_full_fine_tuning_is_the_whole_state_dict_and_moments(
    tiny_model: Any,
) -> None:
    parts = Parts(tiny_model)
    parts.move()
    parts.snapshot(step=1)
    moments = [v for s in parts.optimizer.state.values() for v in s.values()]
    expected = _bytes(tiny_model.state_dict().values()) + _bytes(moments)
    assert parts.guard.snapshot_bytes == expected


def test_frozen_parameters_are_neither_copied_nor_restored(tiny_model: Any) -> None:
    frozen = [p for n, p in tiny_model.named_parameters() if "mlp" not in n]
    for p in frozen:
        p.requires_grad_(False)
    parts = Parts(tiny_model)
    parts.move()
    parts.snapshot(step=1)
    trainable = [p for p in tiny_model.parameters() if p.requires_grad]
    moments = [v for s in parts.optimizer.state.values() for v in s.values()]
    assert parts.guard.snapshot_bytes == _bytes(trainable) + _bytes(moments)
    weights = clone_params(tiny_model)
    parts.move()
    with torch.no_grad():
        frozen[0].add_(1.0)  # no step changes a frozen tensor; a rollback leaves it alone
    parts.rollback(step=2)
    for p, w in zip(tiny_model.parameters(), weights, strict=True):
        if p.requires_grad:
            assert torch.equal(p.detach(), w)
    assert torch.equal(frozen[0].detach(), weights[0] + 1.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_check_finds_one_non_finite_element_in_any_gradient(tiny_model: Any, bad: float) -> None:
    guard = RollbackGuard(RollbackSettings())
    params = list(tiny_model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    grad = params[-1].grad
    assert grad is not None
    grad.view(-1)[grad.numel() // 2] = bad
    assert not guard.check(torch.tensor(1.0), params)
    assert guard.last_cause == "non_finite_grad"


def test_check_passes_finite_gradients_too_large_to_square(tiny_model: Any) -> None:
    guard = RollbackGuard(RollbackSettings())
    params = list(tiny_model.parameters())
    for p in params:
        p.grad = torch.full_like(p, -3.0e38)  # finite; its square overflows float32
    assert guard.check(torch.tensor(1.0), params)


def test_check_reads_past_an_empty_gradient_shard(tiny_model: Any) -> None:
    # under FSDP2 a rank's shard of a small tensor may hold no element
    guard = RollbackGuard(RollbackSettings())
    params = list(tiny_model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    empty = torch.nn.Parameter(torch.zeros(0))
    empty.grad = torch.zeros(0)
    assert guard.check(torch.tensor(1.0), [empty, *params])
    grad = params[0].grad
    assert grad is not None
    grad.view(-1)[0] = math.nan
    assert not guard.check(torch.tensor(1.0), [empty, *params])
