"""Overlong reward shaping (`algo.overlong`): what a completion that runs into max_tokens costs.

- none: nothing.
- mask: truncated completions (max_tokens reached without an end token) leave the loss; they
  still count in their group's mean and std, so the others' advantages are unchanged (TRL's
  `mask_truncated_completions`, DAPO's overlong filtering).
- soft: DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, Eq. 13), added to
  the reward before advantages. With L_max = generator.max_tokens and the buffer
  L_cache = algo.overlong_buffer,

      R_length(y) = 0                                   if |y| <= L_max - L_cache
                    ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                    -1                                  if L_max < |y|

  times `algo.overlong_factor` (verl's `overlong_penalty_factor`; 1 is the paper's).

Invariants: the penalty is 0 up to L_max - L_cache, falls linearly to -factor at L_max and
stays there; a NaN reward (a failed reward function) stays NaN; the raw rewards are kept for
the step's statistics (pass rate, reward mean): only the advantages see the penalty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from grpo_stream.config.algo import AlgoSettings

Mode = Literal["none", "mask", "soft"]


def soft_penalty(
    lengths: npt.ArrayLike, max_tokens: int, buffer: int, factor: float = 1.0
) -> npt.NDArray[np.float64]:
    """R_length of completions of `lengths` tokens (the module doc's formula), times `factor`."""
    if buffer < 1 or buffer > max_tokens:
        raise ValueError(f"overlong buffer {buffer} must be in 1..max_tokens ({max_tokens})")
    n = np.asarray(lengths, dtype=np.float64)
    expected = max_tokens - buffer  # L_max - L_cache: the longest completion not penalised
    penalty = np.clip((expected - n) / buffer, -1.0, 0.0)
    return factor * penalty


def shaped_rewards(
    rewards: npt.NDArray[np.float32],
    offsets: npt.NDArray[np.int64],
    max_tokens: int,
    buffer: int,
    factor: float,
) -> npt.NDArray[np.float32]:
    """`rewards` (G,) plus each completion's soft penalty; `offsets` (G+1,) give the lengths."""
    lengths = np.diff(np.asarray(offsets, dtype=np.int64))
    return (rewards + soft_penalty(lengths, max_tokens, buffer, factor)).astype(np.float32)


def trained_mask(valid: npt.NDArray[np.bool_], truncated: list[bool]) -> npt.NDArray[np.bool_]:
    """overlong = mask: the completions that stay in the loss (valid and not truncated)."""
    if len(truncated) != len(valid):
        raise ValueError(f"{len(truncated)} truncated flags for {len(valid)} completions")
    kept: npt.NDArray[np.bool_] = valid & ~np.asarray(truncated, dtype=bool)
    return kept


@dataclass(frozen=True)
class Overlong:
    """The run's overlong shaping, as the hub applies it to each group it assembles."""

    mode: Mode = "none"
    buffer: int = 1
    factor: float = 1.0

    @classmethod
    def of(cls, algo: AlgoSettings) -> Overlong:
        return cls(algo.overlong, algo.overlong_buffer, algo.overlong_factor)

    def rewards(
        self, rewards: npt.NDArray[np.float32], offsets: npt.NDArray[np.int64], max_tokens: int
    ) -> npt.NDArray[np.float32]:
        """The rewards advantages are computed from (soft: shaped; else as given)."""
        if self.mode != "soft":
            return rewards
        return shaped_rewards(rewards, offsets, max_tokens, self.buffer, self.factor)

    def trained(self, valid: npt.NDArray[np.bool_], truncated: list[bool]) -> npt.NDArray[np.bool_]:
        """The completions that become sequences (mask: not the truncated ones)."""
        return trained_mask(valid, truncated) if self.mode == "mask" else valid
