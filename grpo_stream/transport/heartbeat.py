"""Heartbeat bookkeeping: who was heard from when, and when to beat next.

Pure logic over a caller-supplied clock (`now`, seconds from time.monotonic()), so loops and
tests share one code path. Invariants:
- `Heartbeats.lost(now)` returns each silent peer exactly once and forgets it; a peer that beats
  again afterwards is tracked anew (the hub treats it as a fresh registration).
- A peer is lost only when strictly more than `timeout_s` passed since its last beat.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Generic, TypeVar

P = TypeVar("P", bound=Hashable)


class Heartbeats(Generic[P]):
    """Last-seen time per peer with a deadline (transport.heartbeat_timeout_s)."""

    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError("heartbeat timeout must be positive")
        self.timeout_s = timeout_s
        self._last: dict[P, float] = {}

    def beat(self, peer: P, now: float) -> None:
        """Record that `peer` was heard from (any message counts, not only Heartbeat)."""
        self._last[peer] = now

    def forget(self, peer: P) -> None:
        """Stop tracking a peer that left cleanly."""
        self._last.pop(peer, None)

    def lost(self, now: float) -> list[P]:
        """Peers silent past the deadline, oldest first; they are forgotten."""
        cutoff = now - self.timeout_s
        gone = sorted((p for p, t in self._last.items() if t < cutoff), key=self._last.__getitem__)
        for peer in gone:
            del self._last[peer]
        return gone

    def next_deadline(self) -> float | None:
        """When the next peer would be lost if nobody beats (None with no peers)."""
        if not self._last:
            return None
        return min(self._last.values()) + self.timeout_s

    def __contains__(self, peer: object) -> bool:
        return peer in self._last

    def __len__(self) -> int:
        return len(self._last)


class HeartbeatSender:
    """Tells a service loop when its next Heartbeat is due (transport.heartbeat_interval_s)."""

    def __init__(self, interval_s: float, now: float) -> None:
        if interval_s <= 0:
            raise ValueError("heartbeat interval must be positive")
        self.interval_s = interval_s
        self._next = now  # the first beat is due at once

    def due(self, now: float) -> bool:
        return now >= self._next

    def sent(self, now: float) -> None:
        """Record a beat (or any message to the hub, which also proves liveness)."""
        self._next = now + self.interval_s

    def wait_ms(self, now: float) -> int:
        """Milliseconds until the next beat is due (a poll timeout; 0 when already due)."""
        return max(0, math.ceil((self._next - now) * 1000.0))  # ceil: never wake early
