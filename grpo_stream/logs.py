"""Structured logs: JSON lines per service in RUN_DIR/logs, a readable console, and merging.

`setup_logging` is called once by each service's entry point (never at import time). Every
event is bound to `service` and `instance`, so merged logs say who spoke. It also leaves its
choices in `CHILD_ENV`, so that processes a library spawns on its own (vLLM's engine core and
workers) log the same way: `setup_child_logging`, called there (by our vLLM plugin), sends
their events and their libraries' records as JSON to the same file and stream, at the same
level, where `up`'s console shows a library's records only from warning up.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import structlog

from grpo_stream.jsonl import JsonlTail, read_rows

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
CHILD_ENV = "GRPO_STREAM_CHILD_LOGGING"
"""How this service logs (JSON: service, instance, run_dir, level, console, console_json),
for the processes it spawns through a library."""


class _JsonFileProcessor:
    """Writes each event as one JSON line to a file, then passes it on unchanged."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def __call__(self, logger: Any, name: str, event: dict[str, Any]) -> dict[str, Any]:
        self._stream.write(json.dumps(event, default=str) + "\n")
        self._stream.flush()
        return event


def setup_logging(
    service: str,
    instance: str,
    run_dir: Path | None = None,
    level: str = "info",
    console: bool = True,
    console_json: bool = False,
) -> structlog.stdlib.BoundLogger:
    """Configure structlog for this process and return the bound service logger.

    With `run_dir`, events go as JSON lines to RUN_DIR/logs/<service>-<instance>.jsonl.
    `console_json` prints JSON lines on stderr (what `up` merges); else a readable renderer.
    """
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
        _add_unix_time,
        structlog.processors.format_exc_info,
    ]
    if run_dir is not None:
        log_dir = Path(run_dir) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        stream = (log_dir / f"{service}-{instance}.jsonl").open("a", encoding="utf-8")
        processors.append(_JsonFileProcessor(stream))
    if console and console_json:
        processors.append(structlog.processors.JSONRenderer())
    elif console:
        processors.append(structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    else:
        processors.append(_drop)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS.get(level, 20)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service, instance=instance)
    capture_stdlib_logging()
    os.environ[CHILD_ENV] = json.dumps(
        {
            "service": service,
            "instance": instance,
            "run_dir": None if run_dir is None else str(run_dir),
            "level": level,
            "console": console,
            "console_json": console_json,
        }
    )
    return structlog.get_logger()  # type: ignore[no-any-return]


def setup_child_logging() -> bool:
    """In a process a library spawned from a service (vLLM's engine core, its workers): log
    as that service does (`CHILD_ENV`). Nothing when this process set up its own logging, or
    was not spawned from a service; returns whether it set anything up."""
    inherited = os.environ.get(CHILD_ENV)
    if structlog.is_configured() or not inherited:
        return False
    how = json.loads(inherited)
    setup_logging(
        str(how["service"]),
        str(how["instance"]),
        None if how["run_dir"] is None else Path(how["run_dir"]),
        str(how["level"]),
        console=bool(how["console"]),
        console_json=bool(how["console_json"]),
    )
    return True


class _ToStructlog(logging.Handler):
    """Library log records (vLLM, torch, ...) as `library.log` events with a `logger`
    field: into the service's JSON log; `up`'s console shows them from warning up."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            structlog.get_logger().log(
                record.levelno, "library.log", logger=record.name, message=record.getMessage()
            )
        except Exception:  # a log line must never take the service down
            self.handleError(record)


def capture_stdlib_logging(level: int = logging.INFO) -> None:
    """Route the standard `logging` tree (and `warnings`) into this process's structlog."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _ToStructlog):
            root.removeHandler(handler)
    root.addHandler(_ToStructlog())
    root.setLevel(level)
    logging.captureWarnings(True)


def _add_unix_time(logger: Any, name: str, event: dict[str, Any]) -> dict[str, Any]:
    event.setdefault("t", round(time.time(), 6))
    return event


def _drop(logger: Any, name: str, event: dict[str, Any]) -> str:
    raise structlog.DropEvent


def get_logger(**bound: Any) -> Any:
    """The process's logger, with extra fields bound."""
    return structlog.get_logger().bind(**bound)


@dataclass(frozen=True)
class LogRecord:
    """One parsed event of a service's log file."""

    t: float
    event: dict[str, Any]


def _records(events: list[dict[str, Any]]) -> list[LogRecord]:
    return [LogRecord(float(event.get("t", 0.0)), event) for event in events]


def _keep(event: dict[str, Any], service: str | None, level: str | None) -> bool:
    if service is not None and event.get("service") != service:
        return False
    return level is None or LEVELS.get(str(event.get("level", "info")), 20) >= LEVELS[level]


def merge_logs(
    run_dir: Path, service: str | None = None, level: str | None = None
) -> list[dict[str, Any]]:
    """All events of RUN_DIR/logs/*.jsonl in time order, filtered by service and minimum level."""
    records: list[LogRecord] = []
    for path in sorted((Path(run_dir) / "logs").glob("*.jsonl")):
        records.extend(_records(read_rows(path)))
    records.sort(key=lambda r: r.t)
    return [r.event for r in records if _keep(r.event, service, level)]


def follow_logs(
    run_dir: Path, service: str | None = None, level: str | None = None, poll_s: float = 0.5
) -> Iterator[dict[str, Any]]:
    """Yield new events as services write them (merged per poll, in time order)."""
    tails: dict[Path, JsonlTail] = {}
    while True:
        batch: list[LogRecord] = []
        for path in sorted((Path(run_dir) / "logs").glob("*.jsonl")):
            batch.extend(_records(tails.setdefault(path, JsonlTail(path)).read()))
        batch.sort(key=lambda r: r.t)
        for rec in batch:
            if _keep(rec.event, service, level):
                yield rec.event
        time.sleep(poll_s)


def format_event(event: dict[str, Any]) -> str:
    """One readable console line for a JSON event."""
    skip = {"event", "level", "ts", "t", "service", "instance"}
    fields = " ".join(f"{k}={v}" for k, v in event.items() if k not in skip)
    who = f"{event.get('service', '?')}-{event.get('instance', '?')}"
    when = str(event.get("ts", ""))[11:23]
    return f"{when} {event.get('level', 'info'):7s} {who:14s} {event.get('event', '')} {fields}"
