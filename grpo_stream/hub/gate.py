"""The staleness gate: how many new prompts may go out now, and the oldest policy version
each may be generated with.

A prompt dispatched now sits behind the groups in the pipeline; those are consumed
`groups_per_step` per trainer step starting at `next_version`, so it will be trained at
version next_version + position // groups_per_step. It is dispatched only if that is at
most `max_staleness` steps after the version it is generated with (`min_version`). The next
step's holes (`grpo_stream.hub.refill`) hold their slots; with `hub.refill_ahead`, groups not
yet scored take a slot at the signal rate (`Refill.per_slot`).

Pure arithmetic on a snapshot of the pipeline (`Pipeline`), which the ledger takes
(`grpo_stream.hub.ledger`: it owns the versions and the stages counted here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Pipeline:
    """What sits ahead of a new prompt, as the gate counts it."""

    groups_per_step: int
    max_staleness: int
    next_version: int  # the trainer's version at its next batch request
    holes: int  # slots of the next step left empty by groups without signal
    buffered: int  # scored groups not yet trained
    unscored: int  # groups in the pipeline not yet scored
    per_slot: float  # groups let out per slot (1.0 unless refill_ahead)

    def capacity(self) -> int:
        """How many more groups the gate lets out: the slots of the next max_staleness + 1
        steps not held by a group in the pipeline or a hole."""
        slots = self.groups_per_step * (self.max_staleness + 1) - self.holes
        return max(0, math.floor((slots - self.buffered) * self.per_slot + 1e-9) - self.unscored)

    def min_version(self, count: int) -> int:
        """Policy version a batch of `count` new prompts must be generated with (at least):
        the last one sits behind the pipeline and the next step's holes."""
        ahead = self.holes + self.buffered + (self.unscored + count) / self.per_slot
        last = max(0, math.ceil(ahead - 1e-9) - 1)
        return max(0, self.next_version + last // self.groups_per_step - self.max_staleness)

    def same_version(self, count: int) -> int:
        """The most of `count` new prompts whose min_version is the first one's (it only
        grows with the count: a binary search)."""
        first = self.min_version(1)
        lo, hi = 1, count
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.min_version(mid) > first:
                hi = mid - 1
            else:
                lo = mid
        return lo
