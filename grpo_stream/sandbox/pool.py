"""The parent's side of every sandbox: one lifecycle for a set of worker processes running
user code (rewards, environments, agents), each of which owns what its messages mean.

Invariants:
- Workers fork from multiprocessing's fork server: a clean single-threaded process started
  once (no threads, no ZeroMQ context), from which each worker forks in milliseconds with
  `WorkerCode.preload` imported there once. They are daemonic (user code cannot start
  multiprocessing children) and die with the fork server, which exits when the parent dies:
  no orphan spins on. This isolates faults, not adversaries: workers run as the same user.
- A worker gets the parent's `sys.path` as it was at `start()`, loads the user code, caps its
  address space at its size then plus `WorkerCode.memory_limit_mb`, and says ready
  (`worker.serve`). `start` returns once every worker has (they load at the same time); a
  worker that cannot load, dies loading, or is not ready within STARTUP_TIMEOUT_S raises the
  pool's error naming the setting, and leaves no worker running.
- A worker in doubt (it died, ran past its `deadline`, or sent what it must not: its owner
  decides) is SIGKILLed, reaped and replaced in its slot (`replace`), counted in `restarts`
  and logged once as `<kind>.worker_replaced`.
- `close` asks every worker to stop, SIGKILLs those still running after STOP_GRACE_S and
  reaps them all; it is idempotent.
- Nothing a worker sends is unpickled: messages are msgpack (`worker.pack`/`unpack`).
"""

from __future__ import annotations

import math
import multiprocessing
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Generic, Self, TypeVar

import msgpack
import structlog

from grpo_stream.sandbox import worker
from grpo_stream.sandbox.worker import Handler, pack, serve, unpack

log = structlog.get_logger()

STARTUP_TIMEOUT_S = 60.0
"""A worker that has not loaded its user code within this time is an error."""
STOP_GRACE_S = 1.0
"""How long `close` lets workers stop by themselves before it kills them."""
_REAP_S = 5.0  # a SIGKILLed process is gone in milliseconds; never hang on one that is not

BAD_REPLY = (EOFError, OSError, ValueError, msgpack.UnpackException)
"""What reading a reply may raise: the worker died (EOF), or sent what is not a message."""


@dataclass(frozen=True)
class WorkerCode:
    """What the workers of one pool run, and how its failures are named."""

    kind: str
    """"reward", "env", "agent": names the processes (`env-worker-0`) and the events."""
    load: Callable[..., Handler]
    """Loads the user code in the worker, `load(conn, *args)` (a module-level function)."""
    args: tuple[Any, ...]
    memory_limit_mb: int
    setting: str
    """The setting that names the user code, for errors (`env.name = 'calc'`)."""
    error: type[Exception]
    """What the pool raises when its workers cannot load or start."""
    preload: tuple[str, ...] = ()
    """Modules the fork server imports once for every worker."""
    max_reply_bytes: int = 1 << 16


@dataclass(eq=False)
class Worker:
    """One worker process and the parent's end of its pipe (a pool's own per-worker state
    goes in a subclass: `WorkerPool`'s `make`)."""

    slot: int
    proc: BaseProcess
    conn: Connection
    started_at: float = field(default_factory=time.monotonic)
    ready: bool = False
    deadline: float = math.inf
    """When what it does now is overdue: its loading, then the call it runs (inf: none)."""

    def send(self, message: Any) -> bool:
        """Send one message (False: the worker is gone)."""
        try:
            self.conn.send_bytes(pack(message))
        except OSError:
            return False
        return True

    def exit_cause(self) -> str:
        """How the (dead) process ended: `signal 9`, `exit code 3`."""
        code = self.proc.exitcode
        return f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"


W = TypeVar("W", bound=Worker)


class WorkerPool(Generic[W]):
    """`count` workers of `code`, each held as `make(slot, proc, conn)`; its events go to
    `logger` (a structlog logger; default this module's)."""

    def __init__(
        self,
        code: WorkerCode,
        count: int,
        make: Callable[[int, BaseProcess, Connection], W],
        logger: Any = None,
    ) -> None:
        if count < 1:
            raise ValueError(f"a {code.kind} pool needs at least one worker (got {count})")
        self.code = code
        self.count = count
        self.workers: list[W] = []
        self.restarts = 0
        self._make = make
        self._log = log if logger is None else logger
        self._ctx = multiprocessing.get_context("forkserver")
        self._sys_path: list[str] = []

    def start(self) -> None:
        """Start every worker and wait until each has loaded the user code."""
        self._sys_path = list(sys.path)
        # Without effect if the fork server already runs (workers then import them themselves).
        self._ctx.set_forkserver_preload([__name__, worker.__name__, *self.code.preload])
        try:
            self.workers = [self._spawn(slot) for slot in range(self.count)]
            self._await_ready(self.workers)
        except BaseException:
            self.close()
            raise

    def replace(self, w: W, cause: str, wait_ready: bool = True, **context: Any) -> W:
        """Kill `w`, reap it and start a fresh worker in its slot; with `wait_ready`, return
        once that one has loaded (else the owner's loop passes its replies to `handshake`).
        `context`: fields of the `<kind>.worker_replaced` event (what was lost)."""
        old = w.proc.pid
        self._reap(w)
        fresh = self._spawn(w.slot)
        self.workers[w.slot] = fresh
        self.restarts += 1
        event = f"{self.code.kind}.worker_replaced"
        self._log.warning(event, slot=w.slot, old=old, pid=fresh.proc.pid, cause=cause, **context)
        if wait_ready:
            self._await_ready([fresh])
        return fresh

    def handshake(self, w: W, reply: Any) -> bool:
        """Whether `reply` is `w`'s word on its loading: `["ready"]` marks it ready; a load
        error raises the pool's error."""
        if reply == ["ready"] and not w.ready:
            w.ready, w.deadline = True, math.inf
            return True
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == "load_error":
            raise self.code.error(f"{self.code.setting} does not load: {reply[1]}")
        return False

    def check_loading(self, w: W) -> None:
        """Raise the pool's error when `w` is still loading and died or is past
        STARTUP_TIMEOUT_S."""
        if w.ready:
            return
        name, setting = w.proc.name, self.code.setting
        if not w.proc.is_alive():
            raise self.code.error(f"{name} exited while loading {setting} ({w.exit_cause()})")
        if time.monotonic() > w.started_at + STARTUP_TIMEOUT_S:
            raise self.code.error(
                f"{name} did not load {setting} within {STARTUP_TIMEOUT_S:.0f} s "
                "(grpo_stream.sandbox.pool.STARTUP_TIMEOUT_S)"
            )

    def receive(self, w: W) -> Any:
        """One reply of `w` (raises one of BAD_REPLY when there is none to read)."""
        return unpack(w.conn.recv_bytes(self.code.max_reply_bytes))

    def close(self) -> None:
        """Stop every worker (SIGKILL after STOP_GRACE_S) and reap it. Idempotent."""
        for w in self.workers:
            w.send(["stop"])  # one already dead is reaped below
        grace_end = time.monotonic() + STOP_GRACE_S
        for w in self.workers:
            w.proc.join(max(0.0, grace_end - time.monotonic()))
            self._reap(w)
        self.workers = []

    def pids(self) -> list[int]:
        """Pids of the current workers (for health reports; end processes by pid, never name)."""
        return [w.proc.pid for w in self.workers if w.proc.pid is not None]

    # ---- processes --------------------------------------------------------------------

    def _spawn(self, slot: int) -> W:
        parent, child = self._ctx.Pipe(duplex=True)
        code = self.code
        args = (child, self._sys_path, code.memory_limit_mb, code.load, *code.args)
        proc = self._ctx.Process(
            target=serve, args=args, name=f"{code.kind}-worker-{slot}", daemon=True
        )
        proc.start()
        child.close()  # the parent keeps only its end, so a dead worker reads as EOF
        w = self._make(slot, proc, parent)
        w.deadline = w.started_at + STARTUP_TIMEOUT_S
        return w

    def _await_ready(self, loading: list[W]) -> None:
        """Wait until every worker of `loading` has loaded (the pool's error otherwise)."""
        while loading:
            timeout = max(0.0, min(w.deadline for w in loading) - time.monotonic())
            wait([w.conn for w in loading] + [w.proc.sentinel for w in loading], timeout)
            for w in loading:
                if w.conn.poll():
                    try:
                        reply = self.receive(w)
                    except BAD_REPLY:
                        w.proc.join(STOP_GRACE_S)  # it died: check_loading says how
                    else:
                        if not self.handshake(w, reply):
                            raise self.code.error(f"{w.proc.name} spoke before it was ready")
                self.check_loading(w)
            loading = [w for w in loading if not w.ready]

    @staticmethod
    def _reap(w: Worker) -> None:
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(_REAP_S)
        w.conn.close()
        if w.proc.exitcode is not None:
            w.proc.close()


class PoolOwner(Generic[W]):
    """The lifecycle every owner of a `WorkerPool` shows its users (the reward, environment
    and agent pools): `start`, `close`, a context manager, `restarts` and `worker_pids`. A
    subclass sets `_pool` in its `__init__`, and gives the calls that carry its messages."""

    _pool: WorkerPool[W]

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the workers and wait until each has loaded its user code."""
        self._pool.start()

    def close(self) -> None:
        """Stop every worker (SIGKILL after a grace period) and reap it. Idempotent."""
        self._pool.close()

    @property
    def restarts(self) -> int:
        """Workers replaced so far."""
        return self._pool.restarts

    def worker_pids(self) -> list[int]:
        """Pids of the current workers (for health reports; end processes by pid, never name)."""
        return self._pool.pids()
