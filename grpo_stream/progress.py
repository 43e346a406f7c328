"""Long waits say what they are doing instead of going silent.

`long_wait("model.load", model=name)` around a model load, a weight fetch or a checkpoint
write: while it lasts longer than `every_s`, a side thread logs `NAME.progress` every
`every_s` seconds (seconds so far, and done/total where the caller reports them), then
`NAME.done` (or `NAME.failed`) with the seconds it took. A wait that ends sooner logs only
at debug level, so the tiny model's 10 ms weight fetches do not flood the console.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog

log = structlog.get_logger()

EVERY_S = 5.0


class Wait:
    """What a long wait has done so far; the caller updates `done`, `total` and `fields`."""

    def __init__(self, name: str, unit: str, fields: dict[str, Any]) -> None:
        self.name = name
        self.unit = unit
        self.fields = fields
        self.done: float | None = None
        self.total: float | None = None
        self.t0 = time.monotonic()
        self.reported = False  # a progress line was logged: so the end is logged too

    def seconds(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seconds": self.seconds(), **self.fields}
        if self.done is not None:
            out["done"] = round(self.done, 2)
            if self.unit:
                out["unit"] = self.unit
        if self.total:
            out["total"] = round(self.total, 2)
            if self.done is not None:
                out["percent"] = round(100.0 * self.done / self.total, 1)
        return out


def _report(wait: Wait, every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        wait.reported = True
        log.info(f"{wait.name}.progress", **wait.snapshot())


@contextmanager
def long_wait(name: str, every_s: float = EVERY_S, unit: str = "", **fields: Any) -> Iterator[Wait]:
    """Report progress of the block every `every_s` seconds while it runs (see module doc)."""
    wait = Wait(name, unit, fields)
    stop = threading.Event()
    reporter = threading.Thread(  # with the caller's bound log fields (service, instance)
        target=contextvars.copy_context().run,
        args=(_report, wait, every_s, stop),
        name=f"progress-{name}",
        daemon=True,
    )
    reporter.start()
    try:
        yield wait
    except BaseException as exc:
        stop.set()
        reporter.join()
        level = log.warning if wait.reported else log.debug
        level(f"{name}.failed", error=f"{type(exc).__name__}: {exc}", **wait.snapshot())
        raise
    stop.set()
    reporter.join()
    level = log.info if wait.reported else log.debug
    level(f"{name}.done", **wait.snapshot())
