"""A generator following the trainer's weights: its announcements watched, the newest version
fetched and applied, a weight server that died or refuses retried with backoff.

Invariants:
- whether to fetch is one rule, `VersionTracker.behind` (grpo_stream.engines.versions);
- a version is applied whole: in place between batches (`update`), or fetched on a thread and
  swapped in by the engine between decoding steps or requests (`background`, an
  `InflightEngine`); a fetch started before the trainer restarted does not clear `reload`;
- a new announce address is a restarted trainer, whose versions restart from its checkpoint:
  its newest is taken whatever its number;
- a failed fetch is retried after a backoff (1 s doubling to FETCH_BACKOFF_MAX_S), each time
  at the weight server the hub names now (a restarted trainer says Hello with its new
  endpoints and the hub pushes them to every peer in a Welcome);
- a batch waits for its `min_version` at most `wait_limit_s` (`ready_for`): a version that
  does not come (the trainer rolled a step back, say) is not waited for forever; the hub
  drops what is too stale, counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.engines.base import Engine
from grpo_stream.engines.inflight import InflightEngine
from grpo_stream.engines.versions import VersionTracker
from grpo_stream.protocols import messages as m
from grpo_stream.ratelimit import RateLimit
from grpo_stream.transport.errors import TransportError
from grpo_stream.transport.fetch import WeightsWatcher

log = structlog.get_logger()


class Link(Protocol):
    """What following needs of the generator's session: its context, keys and the trainer's
    endpoints from the hub's last Welcome."""

    @property
    def ctx(self) -> Any: ...

    @property
    def security(self) -> SecuritySettings: ...

    @property
    def peers(self) -> m.Endpoints | None: ...


class WeightsFollower:
    """Keeps one engine on the trainer's newest weights version."""

    def __init__(
        self,
        engine: Engine,
        link: Link,
        transport: TransportSettings,
        background: bool,
        wait_limit_s: float,
        on_applied: Callable[[], None] = lambda: None,
    ) -> None:
        self.engine = engine
        self.link = link
        self.transport = transport
        self.background = background
        self.wait_limit_s = wait_limit_s
        self.on_applied = on_applied
        self.tracker = VersionTracker()
        self.apply_s = 0.0  # seconds the caller's thread spent fetching or applying weights
        self._watcher: WeightsWatcher | None = None
        self._watched: str | None = None
        self._started: tuple[float, int] | None = None  # background fetch: (t0, restarts)
        self._waiting_since: float | None = None
        self._warn = RateLimit()

    def poll(self) -> None:
        """Follow the trainer's announcements (a new announce address: a restarted trainer)."""
        peers = self.link.peers
        address = None if peers is None else peers.announce
        if address is not None and address != self._watched:
            if self._watcher is not None:
                self._watcher.close()
                self.tracker.trainer_restarted()
            ctx, security = self.link.ctx, self.link.security
            self._watcher = WeightsWatcher(ctx, address, self.transport, security)
            self._watched = address
        if self._watcher is not None:
            seen = self._watcher.poll(0)
            if seen is not None:
                self.tracker.heard(seen)

    def update(self) -> None:
        """Fetch and apply the newest version when behind (or take a background fetch's)."""
        pending = self._started is not None
        if self.tracker.behind(self.engine.version) or pending:
            self._fetch()

    def between_steps(self) -> None:
        """In-flight updates (the engine calls this between decoding steps): follow the
        announcements and swap in a version fetched meanwhile."""
        self.poll()
        self.update()

    def ready_for(self, min_version: int) -> bool:
        """The engine holds `min_version` or newer, or has waited `wait_limit_s` for it."""
        now = time.monotonic()
        if self.engine.version >= min_version:
            self._waiting_since = None
            return True
        if self._waiting_since is None:
            self._waiting_since = now
        if now - self._waiting_since > self.wait_limit_s:
            log.warning("weights.wait_expired", need=min_version, have=self.engine.version)
            self._waiting_since = None
            return True
        return False

    def rejoined(self, version: int) -> None:
        """The hub registered us again and says the trainer holds `version`."""
        self.tracker.heard(version)
        self._waiting_since = None

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    # ---- fetching ---------------------------------------------------------------------

    def _fetch(self) -> None:
        peers = self.link.peers
        if peers is None or not self.tracker.may_fetch(time.monotonic()):
            return
        if self.background and isinstance(self.engine, InflightEngine):
            self._fetch_in_background(self.engine, peers.weights)
            return
        t0 = time.perf_counter()
        try:
            version = self.engine.update_from_server(peers.weights, -1)
        except TransportError as exc:
            self._failed(peers.weights, exc)
            return
        self.apply_s += time.perf_counter() - t0
        self._applied(version, time.perf_counter() - t0, fresh=True)

    def _fetch_in_background(self, engine: InflightEngine, address: str) -> None:
        """Apply what a background fetch brought, then start the next one if still behind."""
        t0 = time.perf_counter()
        try:
            version = engine.take_fetched()
        except TransportError as exc:
            self._started = None
            self._failed(address, exc)
            return
        if version is not None:
            self.apply_s += time.perf_counter() - t0
            started, restarts = self._started or (t0, self.tracker.restarts)
            self._started = None
            fresh = restarts == self.tracker.restarts
            self._applied(version, time.perf_counter() - started, fresh)
        if self.tracker.behind(engine.version) and engine.fetch_in_background(address):
            self._started = (time.perf_counter(), self.tracker.restarts)

    def _failed(self, address: str, exc: TransportError) -> None:
        backoff = self.tracker.failed(time.monotonic())
        count = self._warn.allow("weights.fetch_failed")
        if count is not None:
            log.warning(
                "weights.fetch_failed",
                address=address,
                error=str(exc),
                failures=self.tracker.failures,
                retry_in_s=backoff,
                count=count,
            )

    def _applied(self, version: int, seconds: float, fresh: bool) -> None:
        self.tracker.applied(version, fresh)
        log.info("weights.applied", version=version, seconds=round(seconds, 4))
        self.on_applied()
