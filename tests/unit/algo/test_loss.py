"""The GRPO loss: gradients, clipping, dual clip, importance weights, KL, aggregation."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from grpo_stream.algo.logprobs import token_logprobs
from grpo_stream.algo.loss import grpo_loss, loss_totals
from grpo_stream.config.algo import LossSettings


def model_batch(b: int = 6, t: int = 10, vocab: int = 16) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (b, t), generator=gen)
    attention = torch.ones(b, t, dtype=torch.long)
    completion = torch.zeros(b, t, dtype=torch.bool)
    for i in range(b):
        end = t - (i % 3)  # rows of different completion lengths, right-padded
        attention[i, end:] = 0
        completion[i, 3:end] = True
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}


def leaf(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, requires_grad=True)


def test_gradient_at_ratio_one_equals_policy_gradient(tiny_model: Any) -> None:
    data = model_batch()
    mask = data["completion_mask"]
    advantages = torch.tensor([1.0, -0.5, 2.0, 0.0, -1.5, 0.3])
    params = list(tiny_model.parameters())
    logp, _ = token_logprobs(tiny_model, **data, chunk=4)
    loss, _ = grpo_loss(logp, logp.detach(), advantages, mask, LossSettings(off_policy="behaviour"))
    got = torch.autograd.grad(loss, params)
    logp, _ = token_logprobs(tiny_model, **data, chunk=4)
    mean_t = (logp * mask).sum(-1) / mask.sum(-1)  # (B,)
    reference = -(advantages * mean_t).sum() / mask.shape[0]
    expected = torch.autograd.grad(reference, params)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [("grpo", 0.5), ("dapo", -0.25), ("dr_grpo", -0.125)],
)
def test_aggregation_matches_hand_computation(aggregation: str, expected: float) -> None:
    # ratio 1, so each token's loss is -A: row 0 has 3 tokens of -1, row 1 one token of +2
    logp = torch.zeros(2, 4)
    mask = torch.tensor([[True, True, True, False], [False, True, False, False]])
    settings = LossSettings.model_validate({"aggregation": aggregation, "off_policy": "behaviour"})
    loss, _ = grpo_loss(logp, logp, torch.tensor([1.0, -2.0]), mask, settings, max_tokens=4)
    assert loss.item() == pytest.approx(expected)


def test_dr_grpo_needs_max_tokens() -> None:
    logp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="max_tokens"):
        grpo_loss(
            logp,
            logp,
            torch.ones(1),
            logp.bool(),
            LossSettings(off_policy="behaviour", aggregation="dr_grpo"),
        )


def test_masked_tokens_never_count_even_when_nan() -> None:
    mask = torch.tensor([[True, True, False]])
    clean = leaf([[-0.5, -1.0, 0.0]])
    dirty = leaf([[-0.5, -1.0, math.nan]])
    old = torch.tensor([[-0.6, -0.9, math.inf]])
    settings = LossSettings(off_policy="behaviour", aggregation="dapo")
    a, _ = grpo_loss(clean, old.nan_to_num(posinf=0.0), torch.ones(1), mask, settings)
    b, _ = grpo_loss(dirty, old, torch.ones(1), mask, settings)
    a.backward()
    b.backward()
    assert a.item() == b.item()
    assert dirty.grad is not None and clean.grad is not None
    assert torch.equal(dirty.grad, clean.grad) and dirty.grad[0, 2] == 0


def test_gradient_vanishes_exactly_on_clipped_tokens() -> None:
    # row 0 (A > 0): ratios 1, 1.5 (above 1 + 0.28: clipped), 0.5 (unclipped branch)
    # row 1 (A < 0): ratios 1, 0.5 (below 1 - 0.2: clipped), 1.5 (unclipped branch)
    logp = leaf([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    old = -torch.log(torch.tensor([[1.0, 1.5, 0.5], [1.0, 0.5, 1.5]]))
    mask = torch.ones(2, 3, dtype=torch.bool)
    loss, metrics = grpo_loss(
        logp, old, torch.tensor([1.0, -1.0]), mask, LossSettings(off_policy="behaviour")
    )
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0, 1] == 0 and logp.grad[1, 1] == 0
    others = [logp.grad[0, 0], logp.grad[0, 2], logp.grad[1, 0], logp.grad[1, 2]]
    assert all(g != 0 for g in others)
    assert metrics["clip_frac_low"] == pytest.approx(1 / 6)
    assert metrics["clip_frac_high"] == pytest.approx(1 / 6)
    assert metrics["clip_frac"] == pytest.approx(2 / 6)
    assert metrics["ratio_mean"] == pytest.approx(1.0)


def test_dual_clip_bounds_negative_advantage_loss_and_stops_its_gradient() -> None:
    logp = leaf([[math.log(5.0), math.log(2.0)]])  # ratios 5 (> c = 3) and 2 (< c)
    mask = torch.ones(1, 2, dtype=torch.bool)
    settings = LossSettings(off_policy="behaviour", dual_clip=3.0, aggregation="dapo")
    loss, metrics = grpo_loss(logp, torch.zeros(1, 2), torch.tensor([-1.0]), mask, settings)
    loss.backward()
    assert loss.item() == pytest.approx((3.0 + 2.0) / 2)
    assert logp.grad is not None and logp.grad[0, 0] == 0 and logp.grad[0, 1] != 0
    assert metrics["dual_clip_frac"] == pytest.approx(0.5)


def test_truncated_importance_weight_scales_gradient_and_is_capped() -> None:
    logp = leaf([[0.0, 0.0]])
    trainer_old = torch.zeros(1, 2)  # ratio against the trainer's old log-probs is 1
    behaviour = -torch.log(torch.tensor([[0.5, 3.0]]))  # weights 0.5 and 3 -> capped at 2
    mask = torch.ones(1, 2, dtype=torch.bool)
    settings = LossSettings(off_policy="tis", is_cap=2.0, aggregation="dapo")
    loss, metrics = grpo_loss(
        logp, behaviour, torch.ones(1), mask, settings, trainer_old_logp=trainer_old
    )
    loss.backward()
    assert loss.item() == pytest.approx(-(0.5 + 2.0) / 2)
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, -1.0]]))
    assert metrics["is_trunc_frac"] == pytest.approx(0.5)


def test_decoupled_drops_tokens_whose_weight_exceeds_the_cap() -> None:
    logp = leaf([[0.0, 0.0]])
    behaviour = -torch.log(torch.tensor([[0.5, 3.0]]))  # weights 0.5 and 3 (> cap 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    settings = LossSettings(off_policy="decoupled", is_cap=2.0, aggregation="dapo")
    loss, metrics = grpo_loss(
        logp, behaviour, torch.ones(1), mask, settings, trainer_old_logp=torch.zeros(1, 2)
    )
    loss.backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, 0.0]]))
    assert metrics["is_trunc_frac"] == pytest.approx(0.5)


def test_decoupled_ratio_is_clipped_around_the_proximal_policy() -> None:
    # pi_theta / pi_prox = 1.5 > 1 + eps_high with A > 0: clipped, no gradient, although
    # pi_theta / pi_behaviour = 1 would not be
    logp = leaf([[math.log(1.5)]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    settings = LossSettings(off_policy="decoupled", aggregation="dapo")
    behaviour = torch.tensor([[math.log(1.5)]])
    loss, metrics = grpo_loss(
        logp, behaviour, torch.ones(1), mask, settings, trainer_old_logp=torch.zeros(1, 1)
    )
    loss.backward()
    assert logp.grad is not None and logp.grad[0, 0] == 0
    assert metrics["clip_frac_high"] == 1.0


def test_behaviour_clip_zeroes_tokens_past_the_clip_around_the_behaviour_policy() -> None:
    # ratio to pi_prox is 1 on every token; rho = pi_theta / pi_behaviour is 1.5, 1.5, 0.7, 1
    logp = leaf([[0.0, 0.0, 0.0, 0.0]])
    behaviour = -torch.log(torch.tensor([[1.5, 1.5, 0.7, 1.0]]))
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])  # per token
    mask = torch.ones(1, 4, dtype=torch.bool)
    settings = LossSettings(off_policy="tis", behaviour_clip=True, aggregation="dapo")
    loss, metrics = grpo_loss(logp, behaviour, adv, mask, settings, trainer_old_logp=logp.detach())
    loss.backward()
    assert logp.grad is not None
    # 1.5 > 1 + 0.28 with A > 0 and 0.7 < 1 - 0.2 with A < 0: no loss; 1.5 with A < 0 keeps
    # its gradient, -w A / n with w = min(1.5, is_cap); rho = 1 too, -A / n
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 1.5 / 4, 0.0, -1 / 4]]))
    assert metrics["behaviour_clip_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize("mode", ["tis", "decoupled"])
def test_behaviour_clip_with_one_update_is_behaviours_gradient_with_its_weight_capped(
    mode: str,
) -> None:
    gen = torch.Generator().manual_seed(3)
    logp = (torch.rand(8, 6, generator=gen) * -3).requires_grad_()
    behaviour = logp.detach() + torch.randn(8, 6, generator=gen) * 0.8  # u ~0.1 to ~10
    adv = torch.randn(8, generator=gen)
    mask = torch.rand(8, 6, generator=gen) > 0.2
    cap, eps_low, eps_high = 2.0, 0.2, 0.28
    settings = LossSettings(
        off_policy=mode, behaviour_clip=True, is_cap=cap, aggregation="dapo",
        eps_low=eps_low, eps_high=eps_high,
    )  # fmt: skip
    loss, _ = grpo_loss(logp, behaviour, adv, mask, settings, trainer_old_logp=logp.detach())
    loss.backward()
    # reference from the definition: d loss / d logp = -w A [behaviour's clip not binding] / n
    u = torch.exp(logp.detach() - behaviour)
    a = adv[:, None].expand(8, 6)
    binding = ((a > 0) & (u > 1 + eps_high)) | ((a < 0) & (u < 1 - eps_low))
    w = u.clamp(max=cap) if mode == "tis" else torch.where(u > cap, 0.0, u)
    expected = torch.where(mask & ~binding, -w * a, 0.0) / mask.sum()
    torch.testing.assert_close(logp.grad, expected)
    # and behaviour's own gradient wherever the weight is not capped
    plain = logp.detach().clone().requires_grad_()
    grpo_loss(plain, behaviour, adv, mask, LossSettings(aggregation="dapo"))[0].backward()
    assert plain.grad is not None
    kept = mask & (u <= cap)
    torch.testing.assert_close(logp.grad[kept], plain.grad[kept])
    assert bool((mask & (u > cap) & ~binding).any())  # the capped tokens are exercised


@pytest.mark.parametrize("mode", ["behaviour", "none"])
def test_behaviour_clip_needs_tis_or_decoupled(mode: str) -> None:
    with pytest.raises(ValueError, match="behaviour_clip needs"):
        LossSettings.model_validate({"off_policy": mode, "behaviour_clip": True})


@pytest.mark.parametrize("mode", ["tis", "decoupled"])
def test_tis_and_decoupled_need_the_trainers_log_probs(mode: str) -> None:
    logp = torch.zeros(1, 2)
    settings = LossSettings.model_validate({"off_policy": mode})
    with pytest.raises(ValueError, match=f"off_policy='{mode}' needs trainer_old_logp"):
        grpo_loss(logp, logp, torch.ones(1), logp.bool(), settings)


def test_none_is_the_plain_policy_gradient_whatever_the_behaviour_log_probs() -> None:
    logp = leaf([[-1.0, -2.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    settings = LossSettings(off_policy="none", aggregation="dapo")
    loss, metrics = grpo_loss(logp, torch.tensor([[-5.0, 3.0]]), torch.ones(1), mask, settings)
    loss.backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, -0.5]]))
    assert metrics["ratio_mean"] == 1.0


def test_k3_kl_matches_hand_computation_and_is_weighted_by_beta() -> None:
    logp = torch.zeros(1, 2)
    ref = torch.tensor([[0.5, -0.3]])
    k3 = [math.exp(0.5) - 0.5 - 1, math.exp(-0.3) + 0.3 - 1]
    mask = torch.ones(1, 2, dtype=torch.bool)
    settings = LossSettings(off_policy="behaviour", beta=0.1, aggregation="dapo")
    loss, metrics = grpo_loss(logp, logp, torch.zeros(1), mask, settings, ref_logp=ref)
    assert metrics["kl"] == pytest.approx(sum(k3) / 2)
    assert loss.item() == pytest.approx(0.1 * sum(k3) / 2)


def test_positive_beta_without_reference_is_an_error() -> None:
    logp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(
            logp, logp, torch.ones(1), logp.bool(), LossSettings(off_policy="behaviour", beta=0.1)
        )


def test_entropy_metric_is_mean_over_completion_tokens() -> None:
    logp = torch.zeros(1, 3)
    mask = torch.tensor([[False, True, True]])
    entropy = torch.tensor([[9.0, 1.0, 2.0]])
    _, metrics = grpo_loss(
        logp, logp, torch.ones(1), mask, LossSettings(off_policy="behaviour"), entropy=entropy
    )
    assert metrics["entropy"] == pytest.approx(1.5)
    assert metrics["num_tokens"] == 2


@pytest.mark.parametrize("aggregation", ["grpo", "dapo", "dr_grpo"])
def test_micro_batch_accumulation_equals_full_batch(tiny_model: Any, aggregation: str) -> None:
    data = model_batch()
    mask = data["completion_mask"]
    settings = LossSettings.model_validate(
        {"off_policy": "behaviour", "aggregation": aggregation, "eps_low": 0.01, "eps_high": 0.01}
    )
    gen = torch.Generator().manual_seed(2)
    old = torch.where(mask, -2.8 + 0.3 * torch.randn(mask.shape, generator=gen), 0.0)
    advantages = torch.randn(mask.shape[0], generator=gen)
    params = list(tiny_model.parameters())

    logp, _ = token_logprobs(tiny_model, **data, chunk=8)
    full, _ = grpo_loss(logp, old, advantages, mask, settings, max_tokens=10)
    full_grads = torch.autograd.grad(full, params)

    seqs, tokens = loss_totals(mask)
    total = torch.zeros(())
    for sl in (slice(0, 2), slice(2, 3), slice(3, 6)):
        part = {k: v[sl] for k, v in data.items()}
        logp, _ = token_logprobs(tiny_model, **part, chunk=8)
        loss, _ = grpo_loss(
            logp, old[sl], advantages[sl], mask[sl], settings, max_tokens=10,
            num_seqs_total=seqs, num_tokens_total=tokens,
        )  # fmt: skip
        loss.backward()
        total += loss.detach()
    assert total.item() == pytest.approx(full.item(), rel=1e-5)
    for p, g in zip(params, full_grads, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-7)


def test_per_token_advantages_weight_each_token_by_its_own_advantage() -> None:
    """(B, T) advantages (per-turn returns): at ratio 1 the per-token loss is -A_t, so the
    token mean (dapo) is minus the mean advantage over the mask."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.4, -0.6]])
    mask = torch.tensor([[True, False, True], [True, True, False]])
    adv = torch.tensor([[0.5, 9.0, -1.0], [2.0, 0.0, 7.0]])  # 9 and 7 sit outside the mask
    settings = LossSettings(off_policy="behaviour", aggregation="dapo")
    loss, _ = grpo_loss(logp, logp, adv, mask, settings)
    assert float(loss) == pytest.approx(-(0.5 - 1.0 + 2.0 + 0.0) / 4)
