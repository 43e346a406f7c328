"""Importance weights of the off-policy correction: truncation and masks, per token and per
sequence.

Per completion token t of sequence i (mask True), with b = the behaviour log-probs the
generator recorded and p = the trainer's proximal log-probs (pi_prox, no grad), the token's
importance ratio is u_it = pi_prox / pi_behaviour = exp(p_it - b_it), detached. With C =
`is_cap` and F = `is_floor` (1 / C when unset), `algo.loss.off_policy` weighs each token:

    tis        w_it = min(u_it, C)                      truncated IS (Ionides 2008)
    decoupled  w_it = u_it if u_it <= C else 0          one-sided mask (AReaL)
    icepop     w_it = u_it if F <= u_it <= C else 0     two-sided token mask (IcePop, Ling
                                                        team, Ring-1T 2025: M(k; a, b))
    seq_tis    w_it = min(rho_i, C),  rho_i = prod_t u_it = exp(sum_t log u_it)
                                                        sequence-level truncated IS: one
                                                        weight for every token of sequence i

and `algo.loss.seq_mask` then drops whole sequences (w_it = 0 for every t of i) whose ratio
statistic lies outside [L, H] = [`seq_mask_low`, `seq_mask_high`]:

    geometric   g_i = exp((1 / |y_i|) sum_t log u_it)   (the geometric mean of the token
                                                         ratios: verl's geometric rejection)
    arithmetic  a_i = (1 / |y_i|) sum_t u_it            (their arithmetic mean)

Sums and means run over the sequence's completion tokens (mask True) only. A sequence's
statistics need all of its tokens: every sequence lies whole in one micro-batch (training/
packing.py), so the weights do not depend on the micro-batching.

`rho_i` is computed in log space and truncated there (exp(min(sum log u, log C))), so a long
sequence's product cannot overflow; the geometric mean likewise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpo_stream.config.algo import LossSettings


@dataclass(frozen=True)
class Weights:
    """Per-token importance weights (B, T) and where the mode cut them (B, T) bool: truncated
    (tis, seq_tis) or masked (decoupled, icepop); `dropped` (B, T) bool: the tokens of the
    sequences `seq_mask` dropped (all False when it is off). All False outside the mask."""

    weight: torch.Tensor
    cut: torch.Tensor
    dropped: torch.Tensor


def log_ratio(
    trainer_old_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """log u = p - b per token (B, T), detached; 0 outside `mask`."""
    return torch.where(mask, trainer_old_logp - old_logp, 0.0).detach()


def importance_weight(
    trainer_old_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """u = pi_prox / pi_behaviour per token (B, T), detached; 1 outside `mask`."""
    return torch.exp(log_ratio(trainer_old_logp, old_logp, mask))


def token_floor(settings: LossSettings) -> float:
    """F, the lower edge of icepop's band: `is_floor`, or 1 / is_cap when unset."""
    return 1.0 / settings.is_cap if settings.is_floor is None else settings.is_floor


def _mode_weights(
    log_u: torch.Tensor, mask: torch.Tensor, settings: LossSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, cut) of `off_policy` before any sequence mask; log_u (B, T), 0 outside `mask`."""
    cap = settings.is_cap
    u = torch.exp(log_u)  # (B, T)
    mode = settings.off_policy
    if mode == "tis":
        return u.clamp(max=cap), (u > cap) & mask
    if mode == "decoupled":
        over = (u > cap) & mask
        return torch.where(over, 0.0, u), over
    if mode == "icepop":
        outside = ((u < token_floor(settings)) | (u > cap)) & mask
        return torch.where(outside, 0.0, u), outside
    if mode == "seq_tis":
        log_rho = log_u.sum(dim=-1, keepdim=True)  # (B, 1): log of the product
        w = torch.exp(log_rho.clamp(max=math.log(cap))).expand_as(log_u)
        return w, (log_rho > math.log(cap)).expand_as(mask) & mask
    raise ValueError(f"loss.off_policy={mode!r} carries no importance weight")


def sequence_statistic(log_u: torch.Tensor, mask: torch.Tensor, kind: str) -> torch.Tensor:
    """Each sequence's ratio statistic (B,): the geometric or arithmetic mean of its token
    ratios over its completion tokens (1 for a sequence with none)."""
    tokens = mask.sum(dim=-1)
    n = tokens.clamp(min=1)
    if kind == "geometric":
        return torch.exp(log_u.sum(dim=-1) / n)
    mean = torch.where(mask, torch.exp(log_u), 0.0).sum(dim=-1) / n
    return torch.where(tokens > 0, mean, 1.0)


def weights(
    trainer_old_logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
) -> Weights:
    """The importance weights of `settings.off_policy` (tis, decoupled, icepop, seq_tis) with
    `settings.seq_mask` applied; inputs (B, T), `mask` bool."""
    log_u = log_ratio(trainer_old_logp, old_logp, mask)
    w, cut = _mode_weights(log_u, mask, settings)
    dropped = torch.zeros_like(mask)
    if settings.seq_mask != "none":
        stat = sequence_statistic(log_u, mask, settings.seq_mask)  # (B,)
        outside = (stat < settings.seq_mask_low) | (stat > settings.seq_mask_high)
        dropped = outside[:, None] & mask
        w = torch.where(dropped, 0.0, w)
    return Weights(weight=w, cut=cut, dropped=dropped)
