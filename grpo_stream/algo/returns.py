"""Credit assignment for episodes: outcome rewards or per-turn discounted returns.

`algo.returns = "outcome"` (the default) is GRPO on episodes: each episode's reward is its
outcome (the sum of its turn rewards) and its one advantage, group-normalised across the G
episodes of the prompt by `grpo_stream.algo.advantages`, applies to all its sampled tokens.

`algo.returns = "per_turn"`: turn t of episode i (rewards r_{i,1..T_i}) gets the discounted
return-to-go

    G_{i,t} = sum_{k=0}^{T_i - t} gamma^k r_{i,t+k}        (algo.gamma)

and the advantage

    A_{i,t} = (G_{i,t} - b_t) / (s + eps)

- b_t, the baseline at equal turn index: the mean of G_{j,t} over the group's episodes j that
  played a turn t (when at least 2 did; else the mean of every G of the group). Why per turn
  index: G_{i,1} sums every reward of the episode while G_{i,T} holds only the last one, so a
  baseline pooled over all turns would credit early turns for being early; the mean at the
  same turn index compares an action only with the actions of its peers at that point.
- s, the sample std of every G_{j,t} of the group (pooled): one scale per group, like GRPO's,
  and defined even when a late turn index was reached by a single episode. `advantage.scale =
  "none"` divides by 1 (Dr. GRPO); "batch" is treated as "group" for per-turn returns.

Every sampled token of turn t carries A_{i,t}; environment tokens carry 0 (they are outside
the loss mask anyway). A failed episode (NaN outcome) gets 0 everywhere and no part in any
mean or std. A group with fewer than 2 valid returns, or all returns equal, has no signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from grpo_stream.config.algo import AdvantageSettings

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TurnAdvantages:
    """Per-turn advantages of one group's episodes."""

    advantages: list[Floats]  # per episode, (T_i,); zeros for a failed episode
    zero_signal: bool


def discounted_returns(rewards: Sequence[float], gamma: float) -> Floats:
    """G_t = r_t + gamma * G_{t+1}, computed backwards from the last turn."""
    out = np.zeros(len(rewards), dtype=np.float64)
    acc = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = float(rewards[t]) + gamma * acc
        out[t] = acc
    return out


def per_turn_advantages(
    turn_rewards: Sequence[Sequence[float]],
    valid: Sequence[bool],
    gamma: float,
    settings: AdvantageSettings,
) -> TurnAdvantages:
    """A_{i,t} of the module docstring for one group (episode i invalid: all zeros)."""
    returns = [discounted_returns(r, gamma) for r in turn_rewards]
    kept = [g for g, ok in zip(returns, valid, strict=True) if ok]
    pooled = np.concatenate(kept) if kept else np.zeros(0)
    zeros = [np.zeros(len(g)) for g in returns]
    if pooled.size < 2 or float(pooled.max()) == float(pooled.min()):
        return TurnAdvantages(zeros, zero_signal=True)
    scale = 1.0 if settings.scale == "none" else float(pooled.std(ddof=1)) + settings.eps
    longest = max(len(g) for g in returns)
    baseline = np.full(longest, float(pooled.mean()))
    for t in range(longest):
        at_t = [g[t] for g, ok in zip(returns, valid, strict=True) if ok and len(g) > t]
        if len(at_t) >= 2:
            baseline[t] = float(np.mean(at_t))
    advantages = [
        (g - baseline[: len(g)]) / scale if ok else z
        for g, ok, z in zip(returns, valid, zeros, strict=True)
    ]
    return TurnAdvantages(advantages, zero_signal=False)


def token_advantages(
    turn_advantages: Floats, turn_starts: Sequence[int], mask: Sequence[int]
) -> npt.NDArray[np.float32]:
    """Per completion token: its turn's advantage on sampled tokens (mask 1), 0 elsewhere.
    Turn k spans tokens turn_starts[k] .. turn_starts[k+1] (the last one: to the end)."""
    n = len(mask)
    out = np.zeros(n, dtype=np.float32)
    bounds = [*turn_starts, n]
    for k, adv in enumerate(turn_advantages):
        out[bounds[k] : bounds[k + 1]] = adv
    return np.where(np.asarray(mask, dtype=bool), out, 0.0).astype(np.float32)
