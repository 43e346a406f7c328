"""Reward sandbox: reward functions run in worker processes with a timeout and a memory limit.

`RewardPool.score` runs every reward component on every completion of one prompt. Invariants:

- Each (component, completion) call yields a finite float, or NaN and one error line. A reward
  that raises, sleeps or spins past `timeout_s`, exits, exhausts its memory, or returns a
  non-finite value or a non-number never takes the pool down: a worker in doubt is SIGKILLed,
  reaped and replaced, and the next call is served by a healthy worker.
- A failed call makes only its own completion NaN; the others keep their rewards.
- reward = sum over components of weight * value: NaN when any component failed.
- Nothing a worker sends is unpickled: replies are msgpack, checked field by field.

Processes. Workers fork from multiprocessing's fork server: a clean single-threaded process,
never the parent that holds threads and ZeroMQ contexts. They get the parent's `sys.path` at
`start()`, load the reward functions once, then cap their address space (RLIMIT_AS) at its size
after loading plus `memory_limit_mb`: beyond that an allocation raises MemoryError (the call
fails with "memory limit" and the worker is replaced) or kills the worker. Workers are daemonic
(a reward cannot start multiprocessing children) and die with the fork server (Linux
PR_SET_PDEATHSIG), which exits when the parent dies: no orphan spins on. This isolates faults,
not adversaries: workers run as the same user.

Batching. A component's G completions are cut into contiguous chunks, enough to keep every
worker busy; a chunk goes to one worker in one message, which answers once per completion, so
the parent knows which call runs and times each call, not the chunk. When a call costs its
worker, the rest of its chunk goes back to the queue. Worst case: G * timeout_s / workers.
A reward with `score_batch` (a reward model) scores its whole chunk in one call, whose
replies then come at once: for it `timeout_s` bounds the chunk.
`score()` is not thread-safe: one caller at a time.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import structlog

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.ratelimit import RateLimit
from grpo_stream.rewards.sandbox_worker import pack as _pack
from grpo_stream.rewards.sandbox_worker import unpack as _unpack
from grpo_stream.rewards.sandbox_worker import worker_main as _worker_main

log = structlog.get_logger()

STARTUP_TIMEOUT_S = 60.0
"""A worker that has not loaded its reward functions within this time is an error."""
_MAX_REPLY_BYTES = 1 << 16  # a reply is a few numbers and a short message
_STOP_GRACE_S = 1.0
_WORKER_KINDS = frozenset({"raised", "non_finite", "not_a_number", "unparseable"})
"""Failures a worker survives ("unparseable": a judge's output held no score)."""

RewardFn = Callable[..., float]


class RewardPoolError(RuntimeError):
    """The pool cannot serve: reward functions do not load, or workers do not start."""


@dataclass(frozen=True)
class ScoreResult:
    """Rewards of the G completions of one prompt."""

    rewards: npt.NDArray[np.float32]  # (G,) weighted sum; NaN where any component failed
    component_names: list[str]
    components: npt.NDArray[np.float32]  # (C, G) NaN where that call failed
    errors: list[str]  # one line per failed call: "name[index]: cause"


# ---------------------------------------------------------------- parent side


@dataclass
class _Chunk:
    component: int
    indices: list[int]  # completion indices, in the order the worker runs them


@dataclass
class _Worker:
    slot: int
    proc: multiprocessing.process.BaseProcess
    conn: Connection
    started_at: float
    ready: bool = False
    chunk: _Chunk | None = None
    position: int = 0  # position in chunk.indices of the call now running
    deadline: float = math.inf  # when the running call times out


@dataclass
class _Run:
    """State of one `score()` call."""

    prompt: str
    completions: list[str]
    reference: bytes
    components: npt.NDArray[np.float32]  # (C, G)
    queue: deque[_Chunk]
    errors: list[str] = field(default_factory=list)


class RewardPool:
    """Worker processes that score completions with the configured reward functions."""

    def __init__(
        self, specs: list[RewardSpec], workers: int, timeout_s: float, memory_limit_mb: int
    ) -> None:
        if not specs:
            raise ValueError("RewardPool needs at least one reward spec")
        if workers < 1 or timeout_s <= 0 or memory_limit_mb < 1:
            raise ValueError("workers, timeout_s and memory_limit_mb must be positive")
        self._specs = list(specs)
        self._names = [spec.name for spec in specs]
        self._weights = np.array([spec.weight for spec in specs], dtype=np.float32)  # (C,)
        self._n_workers = workers
        self._timeout_s = timeout_s
        self._memory_limit_mb = memory_limit_mb
        self._ctx = multiprocessing.get_context("forkserver")
        self._workers: list[_Worker] = []
        self._sys_path: list[str] = []
        self._closed = False
        self._calls = 0
        self._failures: Counter[str] = Counter()
        self._restarts = 0
        self._warn = RateLimit()  # one failing reward must not flood the log

    # -- lifecycle

    def start(self) -> None:
        """Start the workers and wait until each has loaded the reward functions."""
        if self._closed or self._workers:
            raise RewardPoolError("RewardPool.start() may be called once, before close()")
        self._sys_path = list(sys.path)
        # Fork server: a clean single-threaded process started once (no threads, no ZeroMQ
        # context), from which each worker forks in milliseconds with this module preloaded.
        # Without effect if the fork server already runs (workers then import it themselves).
        self._ctx.set_forkserver_preload([__name__, "grpo_stream.rewards.sandbox_worker"])
        try:
            self._workers = [self._spawn(slot) for slot in range(self._n_workers)]
            while not all(w.ready for w in self._workers):
                self._wait_for_events(None)
        except BaseException:
            self.close()
            raise
        log.info("reward.pool_started", workers=self._n_workers, rewards=self._names)

    def close(self) -> None:
        """Stop every worker (SIGKILL after a grace period) and reap it. Idempotent."""
        self._closed = True
        for w in self._workers:
            with contextlib.suppress(OSError):  # already dead: reaped below
                w.conn.send_bytes(_pack(["stop"]))
        grace_end = time.monotonic() + _STOP_GRACE_S
        for w in self._workers:
            w.proc.join(max(0.0, grace_end - time.monotonic()))
            self._reap(w)
        self._workers = []

    def __enter__(self) -> RewardPool:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """Counters: calls made, failures by cause, worker restarts."""
        return {
            "calls": self._calls,
            "failures": dict(self._failures),
            "restarts": self._restarts,
            "workers": self._n_workers,
        }

    def worker_pids(self) -> list[int]:
        """Pids of the current workers (for health reports; end processes by pid, never name)."""
        return [w.proc.pid for w in self._workers if w.proc.pid is not None]

    # -- scoring

    def score(self, prompt: str, completions: list[str], reference: dict[str, Any]) -> ScoreResult:
        """Score every completion with every reward component."""
        if not self._workers:
            raise RewardPoolError("RewardPool is not started (call start() or use `with`)")
        n_components, group = len(self._specs), len(completions)
        run = _Run(
            prompt=prompt,
            completions=list(completions),
            reference=_pack(reference),
            components=np.full((n_components, group), np.nan, dtype=np.float32),
            queue=deque(self._chunks(n_components, group)),
        )
        try:
            while run.queue or any(w.chunk is not None for w in self._workers):
                self._dispatch(run)
                self._wait_for_events(run)
        except RewardPoolError:
            self.close()  # a replacement worker cannot load its rewards: the pool is broken
            raise
        rewards = (self._weights[:, None] * run.components).sum(axis=0)  # (G,) NaN propagates
        return ScoreResult(
            rewards=rewards.astype(np.float32),
            component_names=list(self._names),
            components=run.components,
            errors=run.errors,
        )

    def _chunks(self, n_components: int, group: int) -> Iterator[_Chunk]:
        pieces = max(1, min(group, -(-self._n_workers // n_components)))
        for component in range(n_components):
            for piece in np.array_split(np.arange(group), pieces):
                if len(piece):
                    yield _Chunk(component, [int(i) for i in piece])

    def _dispatch(self, run: _Run) -> None:
        for w in self._workers:
            if not (w.ready and w.chunk is None and run.queue):
                continue
            chunk = run.queue.popleft()
            texts = [run.completions[i] for i in chunk.indices]
            message = ["score", chunk.component, run.prompt, texts, run.reference]
            try:
                w.conn.send_bytes(_pack(message))
            except OSError:  # died while idle: nothing was running
                run.queue.appendleft(chunk)
                self._replace(w, "died while idle")
                continue
            w.chunk, w.position = chunk, 0
            w.deadline = time.monotonic() + self._timeout_s

    # -- events

    def _wait_for_events(self, run: _Run | None) -> None:
        """Wait for a reply, a death or a deadline, and handle what happened."""
        now = time.monotonic()
        workers = list(self._workers)
        deadlines = [w.deadline if w.ready else w.started_at + STARTUP_TIMEOUT_S for w in workers]
        timeout = max(0.0, min(deadlines, default=now) - now)
        handles = [w.conn for w in workers] + [w.proc.sentinel for w in workers]
        wait(handles, None if math.isinf(timeout) else timeout)
        for w in workers:
            self._handle_worker(w, run)

    def _handle_worker(self, w: _Worker, run: _Run | None) -> None:
        while True:
            try:
                if not w.conn.poll():
                    break
                reply = _unpack(w.conn.recv_bytes(_MAX_REPLY_BYTES))
            except EOFError:  # the worker is gone; its sentinel fires as soon as it is reaped
                w.proc.join(_STOP_GRACE_S)
                break
            except (OSError, ValueError, msgpack.UnpackException):
                self._fail_running(w, run, "protocol", "worker sent a malformed reply")
                return
            if not self._handle_reply(w, reply, run):
                return  # the worker was replaced
        if not w.proc.is_alive():
            self._on_death(w, run)
        elif not w.ready and time.monotonic() > w.started_at + STARTUP_TIMEOUT_S:
            raise RewardPoolError(
                f"reward worker did not load its rewards within {STARTUP_TIMEOUT_S:.0f}s "
                "(grpo_stream.rewards.sandbox.STARTUP_TIMEOUT_S)"
            )
        elif w.chunk is not None and time.monotonic() >= w.deadline:
            self._fail_running(w, run, "timeout", f"timeout after {self._timeout_s}s")

    def _handle_reply(self, w: _Worker, reply: Any, run: _Run | None) -> bool:
        """Apply one reply; False when the worker had to be replaced."""
        if reply == ["ready"]:
            w.ready = True
            return True
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == "load_error":
            raise RewardPoolError(f"reward functions failed to load in a worker: {reply[1]}")
        ok = isinstance(reply, list) and len(reply) == 5 and reply[0] == "result"
        if not (ok and run is not None and w.chunk is not None and reply[1] == w.position):
            self._fail_running(w, run, "protocol", "worker sent an unexpected reply")
            return False
        assert run is not None and w.chunk is not None
        _, _, value, kind, cause = reply
        index = w.chunk.indices[w.position]
        if kind == "memory":  # a worker that hit MemoryError may be in a bad state
            self._fail_running(w, run, "memory", "memory limit")
            return False
        if isinstance(value, float) and math.isfinite(value):
            self._calls += 1
            run.components[w.chunk.component, index] = value
        elif kind in _WORKER_KINDS and isinstance(cause, str):
            self._fail(run, w.chunk.component, index, kind, cause)
        else:
            self._fail_running(w, run, "protocol", "worker sent a malformed result")
            return False
        w.position += 1
        w.deadline = time.monotonic() + self._timeout_s
        if w.position == len(w.chunk.indices):
            w.chunk, w.deadline = None, math.inf
        return True

    def _on_death(self, w: _Worker, run: _Run | None) -> None:
        code = w.proc.exitcode
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        if not w.ready:
            raise RewardPoolError(f"reward worker died while loading its rewards ({how})")
        if w.chunk is None:
            self._replace(w, f"died while idle ({how})")
        else:
            self._fail_running(w, run, "died", f"worker died ({how})")

    def _fail_running(self, w: _Worker, run: _Run | None, kind: str, cause: str) -> None:
        """The running call fails; the worker is replaced; the rest of its chunk is requeued."""
        chunk = w.chunk
        if chunk is not None and run is not None:
            self._fail(run, chunk.component, chunk.indices[w.position], kind, cause)
            rest = chunk.indices[w.position + 1 :]
            if rest:
                run.queue.appendleft(_Chunk(chunk.component, rest))
        self._replace(w, cause)

    def _fail(self, run: _Run, component: int, index: int, kind: str, cause: str) -> None:
        self._calls += 1
        self._failures[kind] += 1
        name = self._names[component]
        run.errors.append(f"{name}[{index}]: {cause}")
        count = self._warn.allow(f"reward.failed:{name}")
        if count is not None:
            log.warning("reward.failed", component=name, index=index, cause=cause, count=count)

    # -- processes

    def _spawn(self, slot: int) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        specs = [spec.model_dump() for spec in self._specs]
        args = (child_conn, specs, self._sys_path, self._memory_limit_mb)
        proc = self._ctx.Process(
            target=_worker_main, args=args, name=f"reward-worker-{slot}", daemon=True
        )
        proc.start()
        child_conn.close()  # the parent keeps only its end, so a dead worker reads as EOF
        return _Worker(slot=slot, proc=proc, conn=parent_conn, started_at=time.monotonic())

    def _replace(self, w: _Worker, reason: str) -> None:
        old_pid = w.proc.pid
        self._reap(w)
        fresh = self._spawn(w.slot)
        self._workers[self._workers.index(w)] = fresh
        self._restarts += 1
        log.info(
            "reward.worker_restarted", slot=w.slot, old=old_pid, pid=fresh.proc.pid, why=reason
        )

    @staticmethod
    def _reap(w: _Worker) -> None:
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join()
        w.proc.close()
        w.conn.close()
