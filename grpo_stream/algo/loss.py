"""The GRPO policy loss: clipped surrogate, truncated importance weight, k3 KL, aggregation.

Per completion token t of sequence i (mask True), with anchor log-probs `a`:

    r = exp(logp - a)                                            (ratio)
    l = -min(r * A_i, clip(r, 1 - eps_low, 1 + eps_high) * A_i)  (clipped surrogate)
    l = min(l, -c * A_i)            if A_i < 0 and dual_clip = c (dual clip)
    l = w * l                                                    (importance weight)
    l = l + beta * k3,  k3 = exp(ref - logp) - (ref - logp) - 1  (if beta > 0)

`settings.off_policy` picks the anchor and the weight. With `b` = old_logp, the behaviour
log-probs the generator recorded, and `p` = trainer_old_logp, the trainer's own no-grad
log-probs at the start of the step (the proximal policy pi_prox), u = exp(p - b) detached:

    tis        a = p,              w = min(u, is_cap)           (truncated IS)
    decoupled  a = p,              w = u if u <= is_cap else 0  (AReaL's decoupled PPO,
                                                                 weight capped by masking)
    icepop     a = p,              w = u if is_floor <= u <= is_cap else 0
    seq_tis    a = p,              w = min(prod_t u_t, is_cap), one weight per sequence
    behaviour  a = b,              w = 1                        (PPO around pi_behaviour)
    none       a = logp.detach(),  w = 1                        (plain policy gradient)

and `seq_mask` (weighted modes only) sets w = 0 on every token of a sequence whose geometric
or arithmetic mean of u lies outside [seq_mask_low, seq_mask_high]. The weights and their
definitions are `grpo_stream.algo.importance`'s.

With `behaviour_clip` (weighted modes only) w is also 0 where behaviour's clip binds,
rho = exp(logp - b) detached: rho > 1 + eps_high with A > 0, or rho < 1 - eps_low with A < 0.
Both trust regions then hold, the one around pi_prox (this batch's updates) and the one
around pi_behaviour (the drift since sampling); with one update per batch the gradient is
behaviour's, u A grad(logp) off its clipped tokens, with u truncated at is_cap.

The weighted modes need `trainer_old_logp`. With one optimizer step per batch pi_prox is the
policy being differentiated, so r = 1 in value and the clip never binds: all the
off-policy correction is in w, which also absorbs any generator/trainer numeric mismatch.
With several updates per batch (trainer.minibatches, pi_prox fixed at the batch's start) r
moves off 1 from the second update on and the clip is a trust region around pi_prox.
Using both ratios against `old_logp` would count the mismatch twice.

Invariants:
- Tokens outside `mask` (prompt, padding) never count: not in the loss, not in a normaliser,
  not in a metric; NaN or inf there changes nothing.
- Aggregation: grpo = mean over each sequence's tokens, then over sequences; dapo = mean over
  all tokens; dr_grpo = sum over tokens / (num sequences x max_tokens).
- Micro-batching: pass the full batch's `num_seqs_total` (rows) and `num_tokens_total`
  (completion tokens, see `loss_totals`) to every micro-batch call; the sum of the
  micro-batch losses then equals the full-batch loss, and so do the summed gradients. Under
  DDP, which averages gradients over W ranks, pass the global totals divided by W.
- Metrics are means over this call's completion tokens (`num_tokens` says how many).
"""

from __future__ import annotations

import torch

from grpo_stream.algo.importance import Weights, weights
from grpo_stream.config.algo import LossSettings


def loss_totals(mask: torch.Tensor) -> tuple[int, int]:
    """(num_seqs, num_tokens) of a full batch's completion mask (B, T): the normalisers."""
    return int(mask.shape[0]), int(mask.bool().sum())


def _surrogate(ratio: torch.Tensor, adv: torch.Tensor, settings: LossSettings) -> torch.Tensor:
    """Per-token clipped (and dual-clipped) surrogate loss; ratio (B, T), adv (B, 1)."""
    clipped = ratio.clamp(1.0 - settings.eps_low, 1.0 + settings.eps_high)
    loss = -torch.minimum(ratio * adv, clipped * adv)  # (B, T)
    if settings.dual_clip is not None:
        bound = -settings.dual_clip * adv  # > 0 where adv < 0
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    return loss


def _aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    max_tokens: int | None,
    num_seqs: float | None,
    num_tokens: float | None,
) -> torch.Tensor:
    per_token = torch.where(mask, per_token, 0.0)
    seqs = float(mask.shape[0]) if num_seqs is None else num_seqs
    if settings.aggregation == "grpo":
        per_seq = per_token.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)  # (B,)
        return per_seq.sum() / seqs
    if settings.aggregation == "dapo":
        tokens = mask.sum().clamp(min=1) if num_tokens is None else max(num_tokens, 1.0)
        return per_token.sum() / tokens
    if max_tokens is None:
        raise ValueError("loss.aggregation='dr_grpo' needs max_tokens (generator.max_tokens)")
    return per_token.sum() / (seqs * max_tokens)


def _metrics(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    extra: dict[str, torch.Tensor],
) -> dict[str, float]:
    """Token means of clip indicators, ratio and `extra` (each (B, T)), one host sync."""
    with torch.no_grad():
        m = mask.float()
        n = m.sum().clamp(min=1)
        low = (adv < 0) & (ratio < 1.0 - settings.eps_low)
        high = (adv > 0) & (ratio > 1.0 + settings.eps_high)
        values = {
            "clip_frac_low": (low * m).sum() / n,
            "clip_frac_high": (high * m).sum() / n,
            "clip_frac": ((low | high) * m).sum() / n,
            "ratio_mean": (torch.where(mask, ratio, 0.0)).sum() / n,
        }
        if settings.dual_clip is not None:
            values["dual_clip_frac"] = (((adv < 0) & (ratio > settings.dual_clip)) * m).sum() / n
        for key, tensor in extra.items():
            values[key] = torch.where(mask, tensor.float(), 0.0).sum() / n
        values["num_tokens"] = m.sum()
        numbers = torch.stack(list(values.values())).tolist()
    return dict(zip(values.keys(), numbers, strict=True))


def behaviour_clipped(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
) -> torch.Tensor:
    """Where the clip around pi_behaviour binds (B, T) bool, False outside `mask`: the ratio
    rho = pi_theta / pi_behaviour (detached) above 1 + eps_high with A > 0 or below
    1 - eps_low with A < 0, where behaviour's surrogate gives no gradient."""
    rho = torch.exp(torch.where(mask, logp.detach() - old_logp, 0.0))
    high = (adv > 0) & (rho > 1.0 + settings.eps_high)
    low = (adv < 0) & (rho < 1.0 - settings.eps_low)
    return (high | low) & mask


def _anchor_and_weights(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    trainer_old_logp: torch.Tensor | None,
    mask: torch.Tensor,
    settings: LossSettings,
) -> tuple[torch.Tensor, Weights | None]:
    """The ratio's anchor log-probs and the importance weights (None: no weight)."""
    mode = settings.off_policy
    if mode == "behaviour":
        return old_logp, None
    if mode == "none":
        return logp.detach(), None
    if trainer_old_logp is None:
        raise ValueError(
            f"loss.off_policy={mode!r} needs trainer_old_logp (the trainer's log-probs at the "
            "start of the step)"
        )
    return trainer_old_logp, weights(trainer_old_logp, old_logp, mask, settings)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    ref_logp: torch.Tensor | None = None,
    max_tokens: int | None = None,
    trainer_old_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_seqs_total: float | None = None,
    num_tokens_total: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar loss and its metrics.

    `logp` (B, T) with grad; `old_logp`, `trainer_old_logp`, `ref_logp`, `entropy` (B, T);
    `advantages` (B,) per sequence or (B, T) per token (per-turn returns); `mask` (B, T)
    bool, the completion tokens the loss covers (sampled tokens only, for episodes).
    `max_tokens` is required with dr_grpo; `num_seqs_total` / `num_tokens_total` default
    to this call's own counts.

    Metrics: clip_frac_low, clip_frac_high, clip_frac, ratio_mean, is_trunc_frac (the tokens
    the mode truncated or masked), num_tokens, plus dual_clip_frac (dual clip on),
    behaviour_clip_frac (behaviour_clip on: the tokens it zeroes), seq_mask_frac (seq_mask
    on: the tokens of the sequences it dropped), kl (ref_logp given), entropy (entropy
    given).
    """
    if settings.beta > 0 and ref_logp is None:
        raise ValueError("loss.beta > 0 needs ref_logp (the frozen reference's log-probs)")
    mask = mask.bool()
    adv = advantages.to(logp.dtype)  # (B, T) per token, or (B,) -> (B, 1)
    adv = adv if adv.dim() == 2 else adv[:, None]
    anchor, w = _anchor_and_weights(logp, old_logp, trainer_old_logp, mask, settings)
    ratio = torch.exp(torch.where(mask, logp - anchor, 0.0))  # (B, T)
    per_token = _surrogate(ratio, adv, settings)
    extra: dict[str, torch.Tensor] = {}
    if w is not None:
        weight = w.weight
        if settings.behaviour_clip:
            outside = behaviour_clipped(logp, old_logp, adv, mask, settings)
            weight = torch.where(outside, 0.0, weight)
            extra["behaviour_clip_frac"] = outside
        if settings.seq_mask != "none":
            extra["seq_mask_frac"] = w.dropped
        per_token = per_token * weight
        extra["is_trunc_frac"] = w.cut
    else:
        extra["is_trunc_frac"] = torch.zeros_like(mask)
    if ref_logp is not None:
        diff = torch.where(mask, ref_logp - logp, 0.0)
        kl = torch.exp(diff) - diff - 1.0  # k3 estimator, >= 0
        if settings.beta > 0:
            per_token = per_token + settings.beta * kl
        extra["kl"] = kl.detach()
    if entropy is not None:
        extra["entropy"] = entropy.detach()
    loss = _aggregate(per_token, mask, settings, max_tokens, num_seqs_total, num_tokens_total)
    return loss, _metrics(ratio.detach(), adv.detach(), mask, settings, extra)
