"""One rate limiter for every repeated warning (rejected messages, failed rewards, failed
weight fetches, redirected requests...).

Invariant: an event of one key is let through at most once per `period_s`; each one let
through says how many of that key were seen since the last (so nothing is hidden, only
folded), and a log stays bounded however fast the cause repeats.
"""

from __future__ import annotations

import time
from collections import Counter

LOG_EVERY_S = 10.0


class RateLimit:
    """Decides when a repeated event may be logged again; counts the ones held back."""

    def __init__(self, period_s: float = LOG_EVERY_S) -> None:
        self._period_s = period_s
        self._last: dict[str, float] = {}
        self._held: Counter[str] = Counter()

    def allow(self, key: str, now: float | None = None) -> int | None:
        """None to stay quiet; else how many events of `key` were seen since the last log."""
        now = time.monotonic() if now is None else now
        self._held[key] += 1
        last = self._last.get(key)
        if last is not None and now - last < self._period_s:
            return None
        self._last[key] = now
        return self._held.pop(key)
