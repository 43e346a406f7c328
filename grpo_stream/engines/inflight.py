"""Weights fetched on a thread while the engine decodes (generator.inflight_updates).

Invariants:
- At most one background fetch runs at a time; its result (the version and its arrays, or the
  error it raised) waits until `take` collects it, and no new fetch starts before then.
- The fetch runs the engine's own fetch function, which holds the engine's fetch lock, so a
  background fetch and a direct one never use the replica at the same time.
- Nothing is applied here: the caller applies a taken version between decoding steps or
  between batches, a whole version at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Protocol, runtime_checkable

import numpy as np

Arrays = list[tuple[str, np.ndarray[Any, Any]]]
Fetched = tuple[int, Arrays]


@runtime_checkable
class InflightEngine(Protocol):
    """An engine that fetches on a thread and swaps versions in between decoding steps."""

    @property
    def version(self) -> int: ...

    def enable_inflight(
        self, between_steps: Callable[[], None] | None, keep_kv: bool = False
    ) -> None:
        """Have `generate` call `between_steps` between its decoding steps."""
        ...

    def fetch_in_background(self, address: str) -> bool:
        """Start fetching the newest version on a thread (False: one is pending)."""
        ...

    def take_fetched(self) -> int | None:
        """Apply a version the background fetch brought (None: none yet)."""
        ...


class BackgroundFetch:
    """One fetch of the newest version at a time, on a worker thread."""

    def __init__(self, fetch: Callable[[str], Fetched]) -> None:
        self._fetch = fetch
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[Fetched] | None = None

    @property
    def busy(self) -> bool:
        """A fetch is running or its result was not taken yet."""
        return self._pending is not None

    def start(self, address: str) -> bool:
        """Start fetching the newest version from `address`; False when one is pending."""
        if self._pending is not None:
            return False
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="weights-fetch")
        self._pending = self._pool.submit(self._fetch, address)
        return True

    def wait(self, timeout_s: float) -> bool:
        """Block until the pending fetch finished (True) or `timeout_s` passed (False)."""
        if self._pending is None:
            return False
        wait([self._pending], timeout=timeout_s)
        return self._pending.done()

    def take(self) -> Fetched | None:
        """The finished fetch's result (None: none finished); re-raises the error it raised."""
        if self._pending is None or not self._pending.done():
            return None
        pending, self._pending = self._pending, None
        return pending.result()

    def close(self) -> None:
        """Wait for a running fetch (bounded by weights.fetch_stall_s), then stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending = None
