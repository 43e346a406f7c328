"""Group-relative advantages: rewards of G completions of one prompt -> one advantage each.

A_i = (r_i - b_i) / (s + eps), where the baseline b_i is the group mean (GRPO) or the mean of
the other completions (leave-one-out, RLOO), and s is the group's std, the batch's std, or 1
with no eps (Dr. GRPO). Stds are sample stds (Bessel's correction, as TRL and verl use).

Invariants:
- A non-finite reward (NaN: the reward function failed) is excluded from every mean and std,
  gets advantage exactly 0 and `valid_mask` False; it is never silently treated as 0.
- A group with fewer than 2 valid rewards, or whose valid rewards are all equal, carries no
  signal: `zero_signal` is True and all its advantages are exactly 0.
- Arithmetic runs in float64, so rewards from 1e-8 to 1e8 give finite float32 advantages.

The hub assembles groups one at a time and calls `group_advantages` per group; with
scale="batch" it passes `stream_batch_std` of the last batch's worth of rewards.
`compute_advantages` is the same computation for a dense (N, G) batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from grpo_stream.config.algo import AdvantageSettings


@dataclass(frozen=True)
class AdvantageResult:
    """Advantages of a batch of N groups of G completions."""

    advantages: torch.Tensor  # (N, G) float32, 0 where invalid or zero-signal
    valid_mask: torch.Tensor  # (N, G) bool, False where the reward is NaN
    zero_signal: torch.Tensor  # (N,) bool


@dataclass(frozen=True)
class GroupAdvantages:
    """Advantages of one group (what the hub computes as each group completes)."""

    advantages: torch.Tensor  # (G,) float32
    valid_mask: torch.Tensor  # (G,) bool
    zero_signal: bool


@dataclass(frozen=True)
class Filtered:
    """The outcome of the dynamic-sampling filter."""

    result: AdvantageResult  # only the kept groups
    kept: torch.Tensor  # (K,) long: indices of the kept groups in the input
    dropped: int  # zero-signal groups removed


def _advantages_2d(
    rewards: torch.Tensor, settings: AdvantageSettings, batch_std: float | None
) -> AdvantageResult:
    r = rewards.to(torch.float64)  # (N, G)
    valid = torch.isfinite(r)
    n = valid.sum(dim=1)  # (N,)
    r0 = torch.where(valid, r, 0.0)
    mean = r0.sum(dim=1) / n.clamp(min=1)  # (N,)
    dev = torch.where(valid, r0 - mean[:, None], 0.0)  # (N, G)
    std = torch.sqrt((dev * dev).sum(dim=1) / (n - 1).clamp(min=1))  # (N,)
    r_max = torch.where(valid, r, -math.inf).amax(dim=1)
    r_min = torch.where(valid, r, math.inf).amin(dim=1)
    zero_signal = (n < 2) | (r_max == r_min)
    if settings.baseline == "leave_one_out":
        # r_i - mean(others) = r_i - (n*mean - r_i)/(n-1) = n/(n-1) * (r_i - mean)
        dev = dev * (n / (n - 1).clamp(min=1))[:, None]
    if settings.scale == "group":
        adv = dev / (std[:, None] + settings.eps)
    elif settings.scale == "batch":
        if batch_std is None:
            raise ValueError("advantage.scale='batch' needs the batch std (batch_std)")
        adv = dev / (batch_std + settings.eps)
    else:
        adv = dev
    keep = valid & ~zero_signal[:, None]
    return AdvantageResult(
        advantages=torch.where(keep, adv, 0.0).to(torch.float32),
        valid_mask=valid,
        zero_signal=zero_signal,
    )


def batch_std(rewards: torch.Tensor) -> float:
    """Sample std of all finite rewards in `rewards` (any shape); 0.0 with fewer than 2."""
    r = rewards.to(torch.float64).flatten()
    r = r[torch.isfinite(r)]
    if r.numel() < 2:
        return 0.0
    return float(r.std(correction=1))


def compute_advantages(rewards: torch.Tensor, settings: AdvantageSettings) -> AdvantageResult:
    """Advantages of a dense batch: `rewards` (N, G), NaN where a reward failed.

    With scale="batch" the std is that of all valid rewards in this batch (`batch_std`).
    Row i equals `group_advantages(rewards[i], settings, batch_std(rewards))`.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (N, G), got shape {tuple(rewards.shape)}")
    std = batch_std(rewards) if settings.scale == "batch" else None
    return _advantages_2d(rewards, settings, std)


def group_advantages(
    rewards: torch.Tensor, settings: AdvantageSettings, batch_std: float | None = None
) -> GroupAdvantages:
    """Advantages of one group: `rewards` (G,), NaN where a reward failed.

    `batch_std` is required with scale="batch" (the hub passes its running batch std) and
    ignored otherwise.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (G,), got shape {tuple(rewards.shape)}")
    res = _advantages_2d(rewards[None, :], settings, batch_std)
    return GroupAdvantages(
        advantages=res.advantages[0],
        valid_mask=res.valid_mask[0],
        zero_signal=bool(res.zero_signal[0]),
    )


def drops_group(group: GroupAdvantages, settings: AdvantageSettings) -> bool:
    """Whether the dynamic-sampling filter drops this group (zero signal and filter enabled)."""
    return settings.filter_zero_signal and group.zero_signal


def filter_zero_signal(result: AdvantageResult, settings: AdvantageSettings) -> Filtered:
    """Drop zero-signal groups when `settings.filter_zero_signal` (DAPO dynamic sampling).

    With the filter off every group is kept and `dropped` is 0.
    """
    if settings.filter_zero_signal:
        kept = torch.nonzero(~result.zero_signal).flatten()
    else:
        kept = torch.arange(result.zero_signal.numel())
    sub = AdvantageResult(
        advantages=result.advantages[kept],
        valid_mask=result.valid_mask[kept],
        zero_signal=result.zero_signal[kept],
    )
    return Filtered(result=sub, kept=kept, dropped=result.zero_signal.numel() - kept.numel())


def combine_rewards(components: torch.Tensor, weights: Sequence[float]) -> torch.Tensor:
    """Weighted sum of reward components: (C, G) -> (G,) float32.

    A completion any of whose components is NaN gets NaN (even with weight 0), so a failed
    reward function is never hidden. The caller keeps `components` for logging.
    """
    if components.dim() != 2:
        raise ValueError(f"components must be (C, G), got shape {tuple(components.shape)}")
    if len(weights) != components.shape[0]:
        raise ValueError(f"{len(weights)} weights for {components.shape[0]} reward components")
    c = components.to(torch.float64)
    w = torch.tensor(list(weights), dtype=torch.float64)
    total = (c * w[:, None]).sum(dim=0)
    total = torch.where(torch.isnan(c).any(dim=0), math.nan, total)
    return total.to(torch.float32)


def batch_window(groups_per_step: int, group_size: int) -> int:
    """Rewards the hub keeps for scale="batch": one batch's worth of completions."""
    return groups_per_step * group_size


def stream_batch_std(recent: Iterable[float]) -> float:
    """The std scale="batch" divides by in the streaming hub.

    Groups are scored one at a time, before the batch they will join exists, so "the
    batch's std" is the sample std of the last `batch_window(...)` finite rewards scored
    (one batch's worth of completions, this group's included, zero-signal groups too);
    1.0 while fewer than 2 rewards are known.
    """
    values = [float(r) for r in recent if math.isfinite(r)]
    if len(values) < 2:
        return 1.0
    return float(torch.tensor(values, dtype=torch.float64).std(correction=1))
