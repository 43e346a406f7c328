"""Failed reward calls as their author needs them: one line with the user's file and line, the
traceback once per distinct error, and a count of the repeats.

Worker side: `describe(exc)` turns an exception raised by a reward into a `Raised`: the cause
("raised KeyError: 'product' (my_rewards.py:7 in accuracy)"), a key that is the same for
every call failing the same way (reward's exception type and the user's frame, not its
message: a message that quotes the completion would make each call distinct), and the
traceback from the reward's own frame down (the sandbox's frames left out).

Parent side: `FailureLog.record` logs the first failure of each distinct (reward, kind, key)
once, with its traceback (`reward.error`, level error; others `reward.failed`, warning), and
then only a count of its repeats, at most once per `RateLimit` period.
"""

from __future__ import annotations

import functools
import os
import sysconfig
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import structlog

from grpo_stream.ratelimit import RateLimit
from grpo_stream.sandbox.worker import short

log = structlog.get_logger()

MAX_TRACE_CHARS = 4000
"""The traceback's last this many characters travel (its innermost frames and the error)."""
_PACKAGE_DIRS = {"site-packages", "dist-packages"}


@dataclass(frozen=True)
class Raised:
    """An exception a reward raised, described for the log."""

    cause: str  # one line: "raised Type: message (file:line in function)"
    key: str  # the same for every call failing the same way: "Type@file:line"
    trace: str  # traceback text from the reward's frame down


def describe(exc: BaseException, skip: int = 1) -> Raised:
    """`exc` as raised through `skip` frames of the caller (the sandbox's call site) first."""
    tb: TracebackType | None = exc.__traceback__
    for _ in range(skip):
        tb = tb.tb_next if tb is not None else None
    frame = user_frame(traceback.extract_tb(tb))
    where = "" if frame is None else f"{_shown(frame.filename)}:{frame.lineno} in {frame.name}"
    name = type(exc).__name__
    message = short(f"raised {name}: {exc}")
    trace = "".join(traceback.format_exception(type(exc), exc, tb))
    return Raised(
        cause=f"{message} ({where})" if where else message,
        key=f"{name}@{where}",
        trace=trace[-MAX_TRACE_CHARS:],
    )


def user_frame(frames: traceback.StackSummary) -> traceback.FrameSummary | None:
    """The innermost frame of code outside the standard library and installed packages
    (the reward's author's), else the innermost frame."""
    for frame in reversed(frames):
        if not _library(frame.filename):
            return frame
    return frames[-1] if frames else None


def _library(path: str) -> bool:
    real = os.path.realpath(path)
    parts = set(real.split(os.sep))
    return bool(parts & _PACKAGE_DIRS) or real.startswith(_stdlib()) or path.startswith("<")


@functools.cache
def _stdlib() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[key]) + os.sep for key in ("stdlib", "platstdlib"))


def _shown(path: str) -> str:
    """A path as a person would type it here: relative to the working directory inside it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith(os.pardir) else relative


class FailureLog:
    """Logs each distinct reward failure once with its traceback, then counts repeats."""

    def __init__(self, logger: Any = None) -> None:
        self._log = log if logger is None else logger  # a structlog logger
        self._seen: set[tuple[str, str, str]] = set()
        self._repeats = RateLimit()

    def record(self, reward: str, index: int, kind: str, cause: str, key: str, trace: str) -> None:
        """A failed call of `reward` on completion `index` (`key`: "" for failures that are
        not an exception, which are distinct by kind)."""
        distinct = (reward, kind, key)
        label = "|".join(distinct)
        if distinct not in self._seen:
            self._seen.add(distinct)
            self._repeats.allow(label)  # the next line about it comes a period later
            if trace:
                self._log.error(
                    "reward.error", reward=reward, index=index, error=cause, traceback=trace
                )
            else:
                self._log.warning(
                    "reward.failed", reward=reward, index=index, kind=kind, cause=cause
                )
            return
        count = self._repeats.allow(label)
        if count is not None:
            self._log.warning("reward.failed", reward=reward, kind=kind, cause=cause, count=count)
