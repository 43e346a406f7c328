"""Live updates for the connected pages: one poller, any number of subscribers.

Invariants:
- nothing is polled while no page is connected: the poller starts with the first subscriber
  and stops within one `poll_s` after the last one leaves (then the hub connection closes);
- a page gets a snapshot of the whole state, then every update made after it, in order
  (the snapshot is taken and the page subscribed under the lock that each poll's update holds
  while it is applied and sent);
- a page that falls `MAX_BEHIND` updates behind is dropped (its stream ends; the browser's
  EventSource reconnects and starts again from a snapshot), so memory stays bounded;
- when the server stops (`close`), every open page gets one last update, polled then (a run
  that `up` has ended says so in it: completed, interrupted, failed), and its stream ends.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
import structlog

from grpo_stream.dashboard.source import RunSource

log = structlog.get_logger()

MAX_BEHIND = 64
"""Updates a page may have queued before it is dropped."""


class Feed:
    """Polls `source` every `poll_s` seconds while anyone listens."""

    def __init__(self, source: RunSource, poll_s: float) -> None:
        self.source = source
        self.poll_s = poll_s
        self.polls = 0  # polls made so far (tests and the bench read it)
        self._subscribers: set[asyncio.Queue[str | None]] = set()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._primed = False

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    async def state(self) -> dict[str, Any]:
        """The whole state after a fresh poll (sent to the pages too)."""
        async with self._lock:
            await self._poll_and_send()
            return self.source.snapshot()

    async def stream(self) -> AsyncIterator[str]:
        """Server-sent events: a snapshot, then the updates."""
        queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=MAX_BEHIND)
        async with self._lock:
            if not self._primed:
                await self._poll_and_send()
            first = sse("snapshot", self.source.snapshot())
            self._subscribers.add(queue)
        self._start()
        try:
            yield first
            while (item := await queue.get()) is not None:
                yield item
        finally:
            self._subscribers.discard(queue)

    async def close(self) -> None:
        """The server is stopping: one last poll for the open pages, then end their streams."""
        async with self._lock:
            if self._subscribers:
                await self._poll_and_send()
            for queue in list(self._subscribers):
                self._subscribers.discard(queue)
                if queue.full():
                    queue.get_nowait()  # room for the end mark
                queue.put_nowait(None)

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while self._subscribers:
                await asyncio.sleep(self.poll_s)
                if not self._subscribers:
                    break
                async with self._lock:
                    await self._poll_and_send()
        finally:
            await anyio.to_thread.run_sync(self.source.close)

    async def _poll_and_send(self) -> None:
        """One poll (its blocking part on a worker thread), applied and sent; hold the lock."""
        polled = await anyio.to_thread.run_sync(self.source.poll)
        update = self.source.apply(polled)
        self.polls += 1
        self._primed = True
        self._send(sse("update", update))

    def _send(self, event: str) -> None:
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                self._subscribers.discard(queue)
                queue.get_nowait()  # room for the end mark
                queue.put_nowait(None)
                log.warning("dashboard.page_dropped", behind=MAX_BEHIND)


def sse(name: str, data: dict[str, Any]) -> str:
    """One server-sent event (JSON data; non-finite floats sent as null)."""
    return f"event: {name}\ndata: {json.dumps(finite(data), separators=(',', ':'))}\n\n"


def finite(value: Any) -> Any:
    """`value` with every non-finite float as None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
