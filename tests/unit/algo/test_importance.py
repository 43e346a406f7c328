"""Importance-sampling masks and truncation, token and sequence level: each against a
reference written from its definition, and their edge cases."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from grpo_stream.algo.importance import sequence_statistic, weights
from grpo_stream.algo.loss import grpo_loss, loss_totals
from grpo_stream.config.algo import LossSettings

EPS_LOW, EPS_HIGH = 0.2, 0.28


@dataclass(frozen=True)
class Case:
    """Float64 inputs: logp (with grad), pi_prox, behaviour (B, T); advantages (B,); mask."""

    logp: torch.Tensor
    prox: torch.Tensor
    behaviour: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor


def case(seed: int = 0, b: int = 12, t: int = 7, spread: float = 0.6) -> Case:
    """Ratios to pi_prox off 1 (so the clip binds somewhere) and u = pi_prox / pi_behaviour
    spread over ~[1/4, 4] (so every band cuts somewhere)."""
    gen = torch.Generator().manual_seed(seed)
    prox = torch.rand(b, t, generator=gen, dtype=torch.float64) * -3
    logp = prox + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.3
    behaviour = prox - torch.randn(b, t, generator=gen, dtype=torch.float64) * spread
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    mask = torch.rand(b, t, generator=gen) > 0.25
    mask[0] = False  # a sequence without completion tokens
    mask[1, 0] = True
    return Case(logp.requires_grad_(), prox, behaviour, adv, mask)


def reference(c: Case, s: LossSettings) -> tuple[float, list[list[float]], list[list[float]]]:
    """The loss (grpo aggregation), d loss / d logp and the weights, token by token from the
    definitions: w from u = pi_prox / pi_behaviour per mode, zero for a sequence outside the
    seq_mask band; l_t = -w_t min(r_t A, clip(r_t) A) with r_t = pi_theta / pi_prox."""
    cap = s.is_cap
    floor = 1 / cap if s.is_floor is None else s.is_floor
    rows = c.mask.shape[0]
    total, grads, ws = 0.0, [], []
    for i in range(rows):
        ts = [t for t in range(c.mask.shape[1]) if c.mask[i, t]]
        a = float(c.adv[i])
        u = {t: math.exp(float(c.prox[i, t]) - float(c.behaviour[i, t])) for t in ts}
        rho = math.prod(u.values())  # the sequence's importance ratio
        if s.off_policy == "tis":
            w = {t: min(u[t], cap) for t in ts}
        elif s.off_policy == "icepop":
            w = {t: u[t] if floor <= u[t] <= cap else 0.0 for t in ts}
        else:  # seq_tis
            w = {t: min(rho, cap) for t in ts}
        if s.seq_mask != "none" and ts:
            geometric = rho ** (1 / len(ts))
            stat = geometric if s.seq_mask == "geometric" else sum(u.values()) / len(ts)
            if not s.seq_mask_low <= stat <= s.seq_mask_high:
                w = {t: 0.0 for t in ts}
        row_grad = [0.0] * c.mask.shape[1]
        row_w = [0.0] * c.mask.shape[1]
        for t in ts:
            r = math.exp(float(c.logp.detach()[i, t]) - float(c.prox[i, t]))
            clipped = min(max(r, 1 - s.eps_low), 1 + s.eps_high)
            total += -w[t] * min(r * a, clipped * a) / len(ts) / rows
            if r * a <= clipped * a:  # the unclipped term is the min: d(r A)/d logp = r A
                row_grad[t] = -w[t] * r * a / len(ts) / rows
            row_w[t] = w[t]
        grads.append(row_grad)
        ws.append(row_w)
    return total, grads, ws


MODES = [
    {"off_policy": "icepop"},
    {"off_policy": "icepop", "is_cap": 5.0, "is_floor": 0.5},
    {"off_policy": "seq_tis"},
    {"off_policy": "tis", "seq_mask": "geometric", "seq_mask_low": 0.8, "seq_mask_high": 1.25},
    {"off_policy": "tis", "seq_mask": "arithmetic", "seq_mask_low": 0.8, "seq_mask_high": 1.6},
    {"off_policy": "icepop", "seq_mask": "geometric", "seq_mask_low": 0.7, "seq_mask_high": 1.4},
]


@pytest.mark.parametrize("extra", MODES, ids=lambda e: "-".join(map(str, e.values())))
def test_loss_and_gradient_match_the_definition(extra: dict[str, object]) -> None:
    s = LossSettings.model_validate({"eps_low": EPS_LOW, "eps_high": EPS_HIGH, **extra})
    c = case()
    loss, _ = grpo_loss(c.logp, c.behaviour, c.adv, c.mask, s, trainer_old_logp=c.prox)
    loss.backward()
    expected, grad, w = reference(c, s)
    assert loss.item() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert c.logp.grad is not None
    torch.testing.assert_close(c.logp.grad, torch.tensor(grad, dtype=torch.float64))
    got = weights(c.prox, c.behaviour, c.mask, s)
    torch.testing.assert_close(torch.where(c.mask, got.weight, 0.0), torch.tensor(w).double())
    # the case exercises the mode: some completion tokens truncated or masked, some not
    marked = (got.cut | got.dropped) & c.mask
    assert bool(marked.any()) and bool((c.mask & ~marked).any())


def test_icepop_drops_tokens_below_the_floor_that_decoupled_keeps() -> None:
    logp = torch.zeros(1, 3, requires_grad=True)
    behaviour = -torch.log(torch.tensor([[0.3, 1.5, 3.0]]))  # u = 0.3, 1.5, 3
    mask = torch.ones(1, 3, dtype=torch.bool)
    settings = LossSettings(off_policy="icepop", is_cap=2.0, aggregation="dapo")
    loss, metrics = grpo_loss(
        logp, behaviour, torch.ones(1), mask, settings, trainer_old_logp=torch.zeros(1, 3)
    )
    loss.backward()
    assert logp.grad is not None  # band [1/2, 2]: only u = 1.5 keeps its weight
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5, 0.0]]))
    assert metrics["is_trunc_frac"] == pytest.approx(2 / 3)
    w = weights(torch.zeros(1, 3), behaviour, mask, LossSettings(off_policy="decoupled"))
    assert w.weight[0, 0].item() == pytest.approx(0.3)  # decoupled keeps the low token


def test_seq_tis_gives_every_token_its_sequences_truncated_product() -> None:
    behaviour = -torch.log(torch.tensor([[0.5, 1.2, 1.0], [1.5, 1.5, 2.0]]))
    mask = torch.tensor([[True, True, False], [True, True, True]])
    w = weights(torch.zeros(2, 3), behaviour, mask, LossSettings(off_policy="seq_tis"))
    # row 0: 0.5 x 1.2 = 0.6 (the padded token's u of 1 does not count); row 1: 4.5 -> cap 2
    torch.testing.assert_close(w.weight[0, :2], torch.tensor([0.6, 0.6]))
    torch.testing.assert_close(w.weight[1], torch.tensor([2.0, 2.0, 2.0]))
    assert w.cut.tolist() == [[False, False, False], [True, True, True]]


def test_seq_tis_of_a_long_sequence_does_not_overflow() -> None:
    behaviour = torch.full((1, 4000), -1.0)  # u = e per token: the product is e^4000
    mask = torch.ones(1, 4000, dtype=torch.bool)
    w = weights(torch.zeros(1, 4000), behaviour, mask, LossSettings(off_policy="seq_tis", is_cap=3))
    assert torch.all(w.weight == 3.0)


def test_geometric_and_arithmetic_means_judge_the_same_sequence_differently() -> None:
    log_u = torch.log(torch.tensor([[4.0, 0.25]]))  # geometric mean 1, arithmetic 2.125
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert sequence_statistic(log_u, mask, "geometric").item() == pytest.approx(1.0)
    assert sequence_statistic(log_u, mask, "arithmetic").item() == pytest.approx(2.125)
    behaviour = -log_u
    kept = LossSettings(off_policy="tis", is_cap=5.0, seq_mask="geometric")
    dropped = LossSettings(off_policy="tis", is_cap=5.0, seq_mask="arithmetic")
    assert not weights(torch.zeros(1, 2), behaviour, mask, kept).dropped.any()
    assert weights(torch.zeros(1, 2), behaviour, mask, dropped).dropped.all()


def test_seq_mask_frac_counts_the_tokens_of_dropped_sequences() -> None:
    logp = torch.zeros(2, 3)
    behaviour = torch.tensor([[0.0, 0.0, 0.0], [-1.0, -1.0, 0.0]])  # row 1: geometric e
    mask = torch.tensor([[True, True, True], [True, True, False]])
    settings = LossSettings(off_policy="tis", seq_mask="geometric")
    _, metrics = grpo_loss(logp, behaviour, torch.ones(2), mask, settings, trainer_old_logp=logp)
    assert metrics["seq_mask_frac"] == pytest.approx(2 / 5)


@pytest.mark.parametrize(
    "extra", [{"off_policy": "seq_tis"}, {"off_policy": "tis", "seq_mask": "arithmetic"}]
)
def test_sequence_modes_do_not_depend_on_the_micro_batching(extra: dict[str, object]) -> None:
    c = case(seed=4, spread=0.2)
    s = LossSettings.model_validate(extra)
    full, _ = grpo_loss(c.logp, c.behaviour, c.adv, c.mask, s, trainer_old_logp=c.prox)
    (full_grad,) = torch.autograd.grad(full, c.logp)
    seqs, tokens = loss_totals(c.mask)
    total = torch.zeros((), dtype=torch.float64)
    totals = {"num_seqs_total": seqs, "num_tokens_total": tokens}
    for sl in (slice(0, 5), slice(5, 6), slice(6, 12)):
        prox = c.prox[sl]
        part, _ = grpo_loss(
            c.logp[sl], c.behaviour[sl], c.adv[sl], c.mask[sl], s, trainer_old_logp=prox, **totals
        )
        part.backward()
        total += part.detach()
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    torch.testing.assert_close(c.logp.grad, full_grad)


@pytest.mark.parametrize("mode", ["behaviour", "none"])
def test_seq_mask_needs_a_weighted_mode(mode: str) -> None:
    with pytest.raises(ValueError, match=r"loss\.seq_mask needs loss\.off_policy in tis"):
        LossSettings.model_validate({"off_policy": mode, "seq_mask": "geometric"})


def test_a_band_with_its_edges_crossed_is_refused() -> None:
    with pytest.raises(ValueError, match=r"loss\.seq_mask_low \(1\.2\) must be below"):
        LossSettings.model_validate({"seq_mask_low": 1.2, "seq_mask_high": 1.1})
    with pytest.raises(ValueError, match=r"loss\.is_floor \(3\.0\) must be below loss\.is_cap"):
        LossSettings.model_validate({"off_policy": "icepop", "is_floor": 3.0, "is_cap": 2.0})


@pytest.mark.parametrize("mode", ["tis", "decoupled", "seq_tis", "behaviour"])
def test_a_token_floor_outside_icepop_is_refused(mode: str) -> None:
    with pytest.raises(
        ValueError, match=r"loss\.is_floor applies only to loss\.off_policy = icepop"
    ):
        LossSettings.model_validate({"off_policy": mode, "is_floor": 0.5})


@pytest.mark.parametrize("mode", ["icepop", "seq_tis"])
def test_the_new_modes_need_the_trainers_log_probs(mode: str) -> None:
    logp = torch.zeros(1, 2)
    settings = LossSettings.model_validate({"off_policy": mode})
    with pytest.raises(ValueError, match=f"off_policy='{mode}' needs trainer_old_logp"):
        grpo_loss(logp, logp, torch.ones(1), logp.bool(), settings)
