"""Dynamic sampling with refill (DAPO): the slots of a step, the refills it may take, the holes
it runs short by, and the signal rate the staleness gate plans replacements with.

Each step has `groups_per_step` slots. A scored group without signal (all rewards equal) is
dropped; while the step's refills last (`max_refill_ratio` x groups_per_step, renewed at each
step served) its slot is refilled: a new prompt takes it. Past that bound (the stop
condition) its slot stays empty, a hole, and the next step is served short by it. A whole
step's worth of holes is dropped as one empty step, so the gate never closes on holes alone.

With `hub.refill_ahead` (the default) the gate lets out 1 / signal_rate prompts per slot (at
most 1 + max_refill_ratio) while refills are left, and a lease holds a step's prompts with
those expected replacements (`lease`), so replacements ride in the batch that loses them;
losses beyond the plan are still replaced when known. Without it a loss is replaced only when
known, in a lease of its own. Planning ahead pays where one more prompt in a batch costs less
than another batch (hf generation; bench.dynamic_sampling); where a prompt costs its
generator a fixed time, it only adds surplus groups that go stale (bench.refill_sim: 0.010 s
of trainer wait a 0.2 s step against 0.000, 39 stale groups against none, zero-signal
rate 0.25).

Invariants: 0 <= holes < groups_per_step; used <= budget(); the signal rate is the share of
the last `SIGNAL_WINDOW_STEPS` steps' worth of scored groups that had signal (1.0 before
any). The ledger owns the counters (`refilled`, `empty_steps`); the gate's formula is
`grpo_stream.hub.gate`'s.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

SIGNAL_WINDOW_STEPS = 4
"""The signal rate is measured over the last this many steps' worth of scored groups."""


@dataclass
class Refill:
    """One hub's refill state (held by its `Ledger`)."""

    groups_per_step: int
    max_refill_ratio: float
    holes: int = 0  # slots of the next step whose groups came back without signal, unrefilled
    used: int = 0  # groups refilled since the last step served
    signals: deque[bool] = field(default_factory=deque)  # recent scored groups: had signal?

    def budget(self) -> int:
        """Groups without signal a step may refill (max_refill_ratio x groups_per_step)."""
        return math.floor(self.max_refill_ratio * self.groups_per_step + 1e-9)

    def signal_rate(self) -> float:
        """Share of the recently scored groups that carried signal (1.0 before any)."""
        return sum(self.signals) / len(self.signals) if self.signals else 1.0

    def observe(self, signal: bool) -> None:
        self.signals.append(signal)
        while len(self.signals) > SIGNAL_WINDOW_STEPS * self.groups_per_step:
            self.signals.popleft()

    def drop(self) -> tuple[bool, bool]:
        """A group without signal was dropped: (refilled, a whole step of holes emptied)."""
        if self.used < self.budget():
            self.used += 1
            return True, False
        self.holes += 1
        if self.holes >= self.groups_per_step:
            self.holes -= self.groups_per_step
            return False, True
        return False, False

    def per_slot(self) -> float:
        """Prompts a slot takes when planned ahead: 1 / signal_rate while refills are left,
        at most 1 + max_refill_ratio; 1 once the step's refills are used up."""
        if self.used >= self.budget():
            return 1.0
        return min(1.0 / max(self.signal_rate(), 1e-9), 1.0 + self.max_refill_ratio)

    def lease(self, base: int, ahead: bool) -> int:
        """Prompts one lease holds: `base` (a step's prompts), and with `ahead` the
        replacements they are expected to need, so both are generated in one batch:
        ceil(base x per_slot)."""
        return math.ceil(base * self.per_slot() - 1e-9) if ahead else base

    def need(self) -> int:
        """Groups the next step waits for: its slots not held by holes (at least one)."""
        return max(1, self.groups_per_step - self.holes)

    def served(self, groups: int) -> None:
        """A step of `groups` groups went out: its holes are spent, its refills renewed."""
        self.holes = max(0, self.holes - max(0, self.groups_per_step - groups))
        self.used = 0

    def check(self) -> None:
        if not 0 <= self.holes < self.groups_per_step:
            raise AssertionError(f"accounting: holes={self.holes} outside 0..groups_per_step")

    def state(self) -> dict[str, Any]:
        return {"holes": self.holes, "refills_used": self.used, "signals": list(self.signals)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.holes = int(state["holes"])
        self.used = int(state["refills_used"])
        self.signals = deque(bool(s) for s in state["signals"])
