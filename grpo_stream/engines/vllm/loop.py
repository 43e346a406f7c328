"""The asyncio side of the vllm engine: vLLM's AsyncLLM lives on an event loop in its own
thread, and the generator's (synchronous) thread talks to it through this module.

Invariants:
- Every call into AsyncLLM runs on the loop (`run`, `spawn`): AsyncLLM is built there too,
  so its output handler serves that loop.
- Each request is one task that drains `AsyncLLM.generate` (outputs FINAL_ONLY: one output,
  all n completions) and puts exactly one `Finished` into the request's sink: the final output,
  or the error that ended it (vLLM's EngineDeadError when the engine core died).
- `requests` maps the vLLM request id of every request not yet finished to its key: added
  when the request is submitted, removed when its `Finished` is put.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import time
from collections.abc import Coroutine, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class Finished:
    """One request's end: vLLM's final RequestOutput, or the error that ended it."""

    key: Hashable
    output: Any
    error: BaseException | None
    seconds: float
    """From submission to the final output."""
    tag: Any = None
    """What the submitter attached to the request (the engine: its adapter and version)."""


@dataclass(frozen=True)
class Request:
    """One call of `AsyncLLM.generate`, and where its end goes."""

    rid: str
    """vLLM's request id."""
    key: Hashable
    """The submitter's name for it, in `Loop.requests` and its `Finished`."""
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    sink: queue.Queue[Finished]
    tag: Any = None


class Loop:
    """An asyncio event loop on a daemon thread, with the caller's log context."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.requests: dict[str, Hashable] = {}
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self.loop.run_forever,),
            name="vllm-loop",
            daemon=True,
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (re-raises its error)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start `coro` on the loop; do not wait."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def request(self, llm: Any, request: Request) -> None:
        """Submit one request: `llm.generate(*request.args, request_id=rid, **request.kwargs)`."""
        self.requests[request.rid] = request.key
        self.spawn(self._drain(llm, request, time.perf_counter()))

    async def _drain(self, llm: Any, request: Request, start: float) -> None:
        final: Any = None
        error: BaseException | None = None
        try:
            async for out in llm.generate(*request.args, request_id=request.rid, **request.kwargs):
                final = out
        except Exception as exc:  # the engine died, or refused the request: the caller decides
            error = exc
        finally:
            self.requests.pop(request.rid, None)
        seconds = time.perf_counter() - start
        request.sink.put(Finished(request.key, final, error, seconds, request.tag))

    def close(self) -> None:
        """Cancel what still runs on the loop (vLLM's output handler too), then stop it."""
        if self.loop.is_closed():
            return
        if self._thread.is_alive():
            self.run(_cancel_all(), timeout_s=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.loop.close()


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
