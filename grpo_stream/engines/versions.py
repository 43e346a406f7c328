"""A generator's weights version in one place: what it heard of the trainer's versions, and
whether its engine must fetch one.

Invariant: one rule says whether the engine is behind (`VersionTracker.behind`): a newer
version was announced (by the trainer's PUB, or by the hub on joining), or the engine must take
the trainer's newest whatever its number (`reload`: the trainer restarted from a checkpoint,
whose versions restart there, or a fetch failed and the server it comes back as may hold an
older one). A fetch that brings a version makes it the truth (`applied`).
"""

from __future__ import annotations

from dataclasses import dataclass

FETCH_BACKOFF_MAX_S = 30.0
"""Longest wait between two tries of a weight server that failed (dead, refusing)."""


@dataclass
class VersionTracker:
    """The trainer's version as the generator heard it, against the one its engine holds."""

    announced: int = 0
    """The newest version heard of (announced, or the hub's on joining, or the last fetched)."""
    reload: bool = False
    """Fetch the trainer's newest whatever its number."""
    restarts: int = 0
    """Trainer restarts seen (a fetch started before the last one brings an old trainer's)."""
    failures: int = 0
    """Fetches failed in a row."""
    retry_at: float = 0.0
    """No fetch before this time (time.monotonic): the backoff after a failure."""

    def behind(self, held: int) -> bool:
        """An engine holding version `held` must fetch."""
        return self.announced > held or self.reload

    def heard(self, version: int) -> None:
        """The trainer (or the hub) says `version` exists."""
        self.announced = max(self.announced, version)

    def trainer_restarted(self) -> None:
        """A new trainer announces (its versions restart from its checkpoint): reload."""
        self.reload = True
        self.restarts += 1

    def may_fetch(self, now: float) -> bool:
        """The backoff after the last failure is over."""
        return now >= self.retry_at

    def failed(self, now: float) -> float:
        """A fetch failed at `now`: reload once it works, after a backoff doubling from 1 s
        to FETCH_BACKOFF_MAX_S; returns the backoff."""
        self.failures += 1
        backoff = min(FETCH_BACKOFF_MAX_S, 2.0 ** (self.failures - 1))
        self.retry_at = now + backoff
        self.reload = True
        return backoff

    def applied(self, version: int, fresh: bool) -> None:
        """The engine now holds `version`, the server's newest. `fresh`: fetched from the
        trainer of now (a fetch started before a restart still leaves `reload` set)."""
        self.reload = self.reload and not fresh
        self.failures = 0
        self.announced = version
