"""A generator's credits: how many prompts it asks the hub for, so that its engine stays full.

Invariants:
- generator.prompts_per_request set: that many, fixed (the generator asks for twice as many
  at start: one lease generating, one waiting, and one more per prompt done).
- An engine with a capacity (`grpo_stream.engines.base.Capacity`: vllm) starts from
  capacity / group_size prompts, the sequences it runs at once. Each prompt is one request of
  G sequences, but a group holds its credit until its longest completion ends, while its
  shorter ones have left the engine: with long-tailed lengths the engine would run part-empty.
  So the window grows, as groups come back, to capacity / (group_size x occupancy), where
  occupancy is the share of its G slots a group used until it ended (sum of its lengths /
  (G x its longest)) over the last `OCCUPANCY_GROUPS` groups. It never shrinks (nor passes
  capacity prompts, occupancy >= 1 / G): the hub's staleness gate bounds what goes out.
- Any other engine (hf: one batch per lease) asks for the largest lease the hub sends
  (`grpo_stream.hub.dispatch.largest_lease`), so a lease with its planned refills is never
  split over two batches for want of credits.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from grpo_stream.config import RunConfig
from grpo_stream.engines.base import Capacity
from grpo_stream.hub.dispatch import largest_lease

OCCUPANCY_GROUPS = 64
"""Finished groups the occupancy is measured over."""


class CreditWindow:
    """The prompts a generator asks for: `start` at once, more as its engine's occupancy says."""

    def __init__(self, start: int, capacity: int | None = None, group_size: int = 1) -> None:
        self.start = start
        self.capacity = capacity  # sequences the engine runs at once (None: fixed credits)
        self.group_size = group_size
        self.asked = 2 * start  # credits asked for in all (beyond one per prompt done)
        self._used: deque[int] = deque(maxlen=OCCUPANCY_GROUPS)  # tokens of each group
        self._slots: deque[int] = deque(maxlen=OCCUPANCY_GROUPS)  # G x longest of each group

    def occupancy(self) -> float:
        """The recent groups' occupancy (1.0 before any)."""
        slots = sum(self._slots)
        return sum(self._used) / slots if slots else 1.0

    def done(self, lengths: Sequence[int]) -> int:
        """A group with these completion lengths came back: credits to ask for now (its own,
        and what the window grew by)."""
        if self.capacity is None:
            return 1
        self._used.append(sum(lengths))
        self._slots.append(len(lengths) * max(lengths, default=0))
        prompts = self.capacity / (self.group_size * self.occupancy())
        want = 2 * min(self.capacity, math.ceil(prompts - 1e-9))
        grow = max(0, want - self.asked)
        self.asked += grow
        return 1 + grow

    def rejoined(self) -> None:
        """The hub forgot us; the session asked for the start window again."""
        self.asked = 2 * self.start


def credit_window(cfg: RunConfig, engine: object) -> CreditWindow:
    """The generator's credits for `engine` under `cfg` (see the module docstring)."""
    fixed = cfg.generator.prompts_per_request
    if fixed is not None:
        return CreditWindow(fixed)
    if isinstance(engine, Capacity):
        group_size = cfg.generator.group_size
        seqs = engine.capacity(cfg.generator.max_tokens)
        return CreditWindow(max(1, seqs // group_size), seqs, group_size)
    return CreditWindow(largest_lease(cfg))
