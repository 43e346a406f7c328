"""The gradient regularizer: closed-form proximal step, EMA of tau, clip, ranks, state."""

from __future__ import annotations

import json
import math
import socket
import sys
from pathlib import Path

import pytest
import torch

from grpo_stream.algo.regularizer import GradRegularizer, prox_norm
from grpo_stream.config.algo import RegularizerSettings


def param_with_grad(values: list[float]) -> torch.nn.Parameter:
    param = torch.nn.Parameter(torch.zeros(len(values)))
    param.grad = torch.tensor(values)
    return param


def numerical_prox(g: torch.Tensor, tau: float, lam: float) -> torch.Tensor:
    """argmin_x lam/2 (||x|| - tau)^2 + 1/2 ||x - g||^2 by plain gradient descent."""
    x = g.clone().requires_grad_(True)
    for _ in range(500):
        objective = lam / 2 * (x.norm() - tau) ** 2 + 0.5 * (x - g).pow(2).sum()
        (grad,) = torch.autograd.grad(objective, x)
        with torch.no_grad():
            x -= 0.1 * grad
    return x.detach()


@pytest.mark.parametrize(("tau", "lam"), [(1.0, 1.0), (2.5, 0.3), (0.5, 4.0)])
def test_closed_form_equals_numerical_minimisation(tau: float, lam: float) -> None:
    g = torch.tensor([3.0, -4.0, 1.0, 2.0], dtype=torch.float64)
    param = param_with_grad(g.tolist())
    settings = RegularizerSettings(tau0=tau, lam=lam, clip_factor=1e6, explode_factor=None)
    GradRegularizer(settings).apply([param])
    assert param.grad is not None
    expected = numerical_prox(g, tau, lam).float()
    torch.testing.assert_close(param.grad, expected, rtol=1e-5, atol=1e-5)


def test_no_change_when_norm_is_at_most_tau() -> None:
    param = param_with_grad([3.0, 0.0])
    reg = GradRegularizer(RegularizerSettings(tau0=10.0))
    stats = reg.apply([param])
    assert param.grad is not None and param.grad.tolist() == [3.0, 0.0]
    assert not stats.fired and stats.norm_after == stats.norm_before == 3.0
    assert reg.tau == pytest.approx(0.9 * 10.0 + 0.1 * 3.0)


def test_first_step_sets_tau_from_norm_and_updates_it_after_use() -> None:
    param = param_with_grad([0.0, 4.0])
    reg = GradRegularizer(RegularizerSettings(lam=1.0))  # tau0 None, init_fraction 0.5
    stats = reg.apply([param])
    assert stats.tau == 2.0  # used: 0.5 * 4
    assert stats.norm_after == pytest.approx(prox_norm(4.0, 2.0, 1.0)) == 3.0
    assert param.grad is not None and param.grad.tolist() == pytest.approx([0.0, 3.0])
    assert reg.tau == pytest.approx(0.9 * 2.0 + 0.1 * 3.0)  # the EMA takes the shrunk norm


def test_hard_clip_at_clip_factor_times_tau_after_the_prox() -> None:
    param = param_with_grad([6.0, 8.0])  # norm 10
    stats = GradRegularizer(RegularizerSettings(tau0=2.0, lam=0.0)).apply([param])
    assert stats.fired and stats.clipped
    assert param.grad is not None and param.grad.norm().item() == pytest.approx(4.0)


def test_disabled_regularizer_reports_but_does_not_touch_gradients() -> None:
    param = param_with_grad([6.0, 8.0])
    stats = GradRegularizer(RegularizerSettings(tau0=2.0, enabled=False)).apply([param])
    assert not stats.fired and stats.norm_before == 10.0
    assert param.grad is not None and param.grad.tolist() == [6.0, 8.0]


def test_non_finite_norm_is_reported_and_changes_nothing() -> None:
    param = param_with_grad([math.nan, 2.0])
    reg = GradRegularizer(RegularizerSettings(tau0=1.0))
    stats = reg.apply([param])
    assert not stats.finite and not stats.fired
    assert reg.tau == 1.0 and reg.steps == 0
    assert param.grad is not None and param.grad[1].item() == 2.0


def test_a_spike_moves_tau_by_the_clipped_norm_only() -> None:
    reg = GradRegularizer(RegularizerSettings(tau0=1.0, explode_factor=None))
    stats = reg.apply([param_with_grad([1000.0])])  # 1000x spike, clipped to 2 * tau
    assert stats.clipped and stats.norm_after == 2.0
    assert reg.tau == pytest.approx(0.9 * 1.0 + 0.1 * 2.0)


def test_a_norm_growing_3x_per_step_is_not_followed_by_the_clip() -> None:
    reg = GradRegularizer(RegularizerSettings(tau0=1.0, explode_factor=None))
    caps = []
    for k in range(1, 5):  # norms 3, 9, 27, 81
        caps.append(2.0 * reg.tau if reg.tau is not None else 0.0)
        reg.apply([param_with_grad([3.0**k])])
    assert caps[-1] < 3.0  # today's clip stays near 2 * tau0 (it was 2 -> 9 -> 70 -> 209)


def test_a_norm_over_explode_factor_tau_is_an_explosion_that_changes_nothing() -> None:
    param = param_with_grad([30.0, 40.0])  # norm 50 > 10 * tau
    reg = GradRegularizer(RegularizerSettings(tau0=4.0, explode_factor=10.0))
    stats = reg.apply([param])
    assert stats.exploded and stats.skip == "explosion" and stats.finite
    assert reg.tau == 4.0 and reg.steps == 0
    assert param.grad is not None and param.grad.tolist() == [30.0, 40.0]


def test_finite_gradients_whose_norm_overflows_are_not_finite() -> None:
    param = param_with_grad([3e19, 3e19])  # each square overflows float32
    reg = GradRegularizer(RegularizerSettings(tau0=1.0))
    stats = reg.apply([param])
    assert torch.isfinite(param.grad).all() and stats.skip == "non_finite_norm"
    assert reg.tau == 1.0


def test_all_zero_first_gradient_leaves_tau_unset() -> None:
    reg = GradRegularizer(RegularizerSettings())
    reg.apply([param_with_grad([0.0, 0.0])])
    assert reg.tau is None
    reg.apply([param_with_grad([0.0, 2.0])])
    assert reg.tau == pytest.approx(0.9 * 1.0 + 0.1 * prox_norm(2.0, 1.0, 1.0))


def test_fired_fraction_counts_steps_where_the_prox_applied() -> None:
    reg = GradRegularizer(RegularizerSettings(tau0=5.0, alpha=0.5))
    norms = [10.0, 1.0, 1.0, 1.0]  # fires on the first step only
    stats = [reg.apply([param_with_grad([n])]) for n in norms]
    assert [s.fired for s in stats] == [True, False, False, False]
    assert stats[-1].fired_frac == pytest.approx(0.25)


def test_state_dict_round_trip_gives_the_same_next_step() -> None:
    reg = GradRegularizer(RegularizerSettings())
    for n in (4.0, 7.0, 1.0):
        reg.apply([param_with_grad([n, 1.0])])
    copy = GradRegularizer(RegularizerSettings())
    copy.load_state_dict(reg.state_dict())
    assert copy.state_dict() == reg.state_dict()
    a, b = param_with_grad([9.0, 1.0]), param_with_grad([9.0, 1.0])
    assert reg.apply([a]) == copy.apply([b])
    assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad)


def test_raise_tau_multiplies_tau() -> None:
    reg = GradRegularizer(RegularizerSettings(tau0=2.0))
    reg.raise_tau(1.5)
    assert reg.tau == 3.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_two_gloo_ranks_scale_like_one_process_on_the_whole_gradient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # spawn children inherit sys.path
    import regularizer_ranks as worker
    import torch.multiprocessing as mp

    mp.spawn(worker.run, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    whole = param_with_grad(worker.FULL_GRADIENT)
    stats = GradRegularizer(RegularizerSettings(**worker.SETTINGS)).apply([whole])
    assert stats.fired
    for rank in ranks:
        assert rank["scale"] == pytest.approx(stats.scale, rel=1e-6)
        assert rank["norm_before"] == pytest.approx(stats.norm_before, rel=1e-6)
    assert whole.grad is not None
    assert ranks[0]["grad"] + ranks[1]["grad"] == pytest.approx(whole.grad.tolist(), rel=1e-6)
    sys.modules.pop("regularizer_ranks", None)


def test_no_explosion_is_declared_before_tau_is_measured() -> None:
    # tau from the first step's norm is no scale yet: a 100x larger second norm (a LoRA
    # adapter leaving B = 0) is clipped, not called an explosion
    reg = GradRegularizer(RegularizerSettings(explode_factor=10.0, explode_after=5))
    first = reg.apply([param_with_grad([1.0])])
    second = reg.apply([param_with_grad([100.0])])
    assert first.finite and not first.exploded
    assert not second.exploded and second.norm_after <= 2.0 * second.tau + 1e-9
