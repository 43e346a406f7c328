"""Processes of a run: started with a command prefix, tracked by pid, stopped by pid.

Each service prints JSON log lines on stderr (`--log-json`); a reader thread per process
parses them into one queue, so the launcher shows one merged stream. Lines that are not
JSON (a traceback, a crash) are kept as `raw` events and the last ones are reported when the
process dies. Processes start in their own session; stopping sends SIGTERM to that process
group and SIGKILL after a grace period — never anything by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# Library progress bars are not log events: keep them out of the merged stream.
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "VLLM_CONFIGURE_LOGGING": "0",  # vLLM's records reach the service's JSON log instead
}


@dataclass
class ServiceSpec:
    """How to start one service instance."""

    instance: str
    service: str
    argv: list[str]
    host: str = "local"
    prefix: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    restarts_left: int = 0
    stdin: Callable[[], bytes] | None = None
    """Bytes for the process's stdin, made at each start, then closed (a shipment for a
    launcher that starts it on another host); None: stdin is /dev/null."""


@dataclass
class Proc:
    spec: ServiceSpec
    popen: subprocess.Popen[bytes]
    started: float
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))


class Launched(Protocol):
    """A started service as `up` watches it: its spec and its last error lines."""

    @property
    def spec(self) -> ServiceSpec: ...

    @property
    def tail(self) -> deque[str]: ...


class Runner(Protocol):
    """What `up` needs from whatever starts its services: local processes (`Supervisor`) or
    Ray actors (grpo_stream.launch.ray.runner)."""

    def start(self, spec: ServiceSpec) -> Launched: ...

    def drain(self, timeout_s: float) -> list[dict[str, Any]]: ...

    def exited(self) -> list[tuple[Launched, int]]: ...

    def stop(self, instance: str, grace_s: float = 30.0) -> int | None: ...

    def stop_all(self, grace_s: float = 15.0) -> None: ...


PROCESS_PREFIX = re.compile(r"^\([\w.-]+ pid=\d+\) (?=\{)")
"""What vLLM writes before each output line of the processes it spawns (`(EngineCore_DP0
pid=123) `): the JSON event after it is the service's all the same (grpo_stream.logs)."""


def parse_line(spec: ServiceSpec, tail: deque[str], line: str) -> dict[str, Any]:
    """One output line of a service as a log event: its JSON object, or a `raw` event for a
    line that is not (kept in `tail` with warnings and errors, to say why it died)."""
    try:
        event = json.loads(PROCESS_PREFIX.sub("", line, count=1))
    except json.JSONDecodeError:
        event = None
    if not isinstance(event, dict):
        tail.append(line)
        event = {"event": "raw", "line": line, "level": "info"}
    elif event.get("level") in ("error", "critical", "warning"):
        tail.append(f"{event.get('event')}: {event.get('error', '')}".strip())
    event.setdefault("service", spec.service)
    event.setdefault("instance", spec.instance)
    event["host"] = spec.host
    return event


class Supervisor:
    """Starts, watches and stops the processes of a run."""

    def __init__(self) -> None:
        self.procs: dict[str, Proc] = {}
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()

    def start(self, spec: ServiceSpec) -> Proc:
        env = {**os.environ, **QUIET_ENV, **spec.env, "PYTHONUNBUFFERED": "1"}
        data = None if spec.stdin is None else spec.stdin()
        popen = subprocess.Popen(
            [*spec.prefix, *spec.argv],
            stdin=subprocess.DEVNULL if data is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_launcher,
        )
        proc = Proc(spec, popen, time.monotonic())
        self.procs[spec.instance] = proc
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        if data is not None:
            threading.Thread(target=_feed, args=(popen, data), daemon=True).start()
        return proc

    def _read(self, proc: Proc) -> None:
        assert proc.popen.stdout is not None
        for raw in proc.popen.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line:
                self.events.put(parse_line(proc.spec, proc.tail, line))

    def drain(self, timeout_s: float) -> list[dict[str, Any]]:
        return drain_events(self.events, timeout_s)

    def exited(self) -> list[tuple[Launched, int]]:
        """Processes that ended since the last call (removed from the watch list)."""
        done: list[tuple[Launched, int]] = []
        for name, proc in list(self.procs.items()):
            code = proc.popen.poll()
            if code is not None:
                done.append((proc, code))
                del self.procs[name]
        return done

    def stop(self, instance: str, grace_s: float = 30.0) -> int | None:
        proc = self.procs.pop(instance, None)
        if proc is None:
            return None
        return _terminate(proc.popen, grace_s)

    def stop_all(self, grace_s: float = 15.0) -> None:
        for proc in self.procs.values():
            signal_group(proc.popen, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(proc.popen, signal.SIGKILL)
                proc.popen.wait()
        self.procs.clear()


def _feed(popen: subprocess.Popen[bytes], data: bytes) -> None:
    """Write `data` to the process's stdin and close it (a process that exits first, or
    never reads, loses it: its exit says why)."""
    assert popen.stdin is not None
    with contextlib.suppress(BrokenPipeError, OSError):
        popen.stdin.write(data)
    with contextlib.suppress(BrokenPipeError, OSError):
        popen.stdin.close()


def die_with_launcher() -> None:
    """In the child, before exec: get SIGTERM when the launcher dies, even by SIGKILL, so a
    killed `up` leaves no service running (Linux; elsewhere services outlive it)."""
    if sys.platform != "linux":
        return

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))


def signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, sig)  # the process group we created for this service


def _terminate(popen: subprocess.Popen[bytes], grace_s: float) -> int:
    signal_group(popen, signal.SIGTERM)
    try:
        return popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        signal_group(popen, signal.SIGKILL)
        return popen.wait()


def drain_events(events: queue.Queue[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
    """The events queued now, waiting up to `timeout_s` for the first (a runner's `drain`)."""
    out = []
    try:
        out.append(events.get(timeout=timeout_s))
        while True:
            out.append(events.get_nowait())
    except queue.Empty:
        pass
    return out
