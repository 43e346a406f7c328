"""Reward sandbox: reward functions run in worker processes with a timeout and a memory limit.

`RewardPool.submit` takes the completions of one prompt (a group) and `collect` returns the
groups whose every reward component has run on every completion (`score`: both, for one
group). Invariants:

- Each (component, completion) call yields a finite float, or NaN and one error line. A reward
  that raises, sleeps or spins past `timeout_s`, exits, exhausts its memory, or returns a
  non-finite value or a non-number never takes the pool down: a worker in doubt is SIGKILLed,
  reaped and replaced, and the next call is served by a healthy worker.
- A failed call makes only its own completion NaN (and its copies': see the cache below);
  the others keep their rewards.
- reward = sum over components of weight * value: NaN when any component failed.
- Nothing a worker sends is unpickled: replies are msgpack, checked field by field.
- A failure raised by a reward is logged once per distinct error with its traceback, then
  counted (`failures.FailureLog`); its error lines name the user's file and line.

The verdict cache: a completion that repeats within a group runs once per component, its
value given to every copy (`calls.GroupCalls`); nothing is kept across groups, so a cache
never crosses references, requests or runs.

Processes: the sandbox's (`grpo_stream.sandbox.pool`: fork server, the parent's `sys.path`,
daemonic workers that die with their parent, start, replacement and shutdown). Workers load the
reward functions once, then cap their address space (RLIMIT_AS) at its size after loading plus
`memory_limit_mb`: beyond that an allocation raises MemoryError (the call fails with "memory
limit" and the worker is replaced) or kills the worker. A replacement loads while the other
workers serve; one that cannot load breaks the pool (RewardPoolError). A replaced worker's CPU
time, as it last reported it, stays counted (`cpu_s`).

Batching. A group's calls (every component on every distinct completion) go to one worker in
one message, unless workers would idle: then they are cut into as many chunks as there are
workers without work. The worker replies with the results so far at least every `FLUSH_S`
(sandbox_worker), so a fast reward costs one message per group and a slow one a reply per
call; the running call's deadline is the last reply + FLUSH_S + `timeout_s`. When a worker
is lost (a timeout, a death, a malformed reply) with one call of its chunk unanswered, that
call fails; with several, each is retried on its own (rewards are pure), so the one at fault
fails alone and the others keep their values: a hang then costs about 2 x timeout_s. After a
MemoryError the worker says which call hit it, and the calls it did not run go back to the
queue. A reward with `score_batch` (a reward model) scores its run of a chunk in one call:
for it `timeout_s` bounds that call.
The pool is not thread-safe: one caller at a time.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

import numpy as np
import structlog

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards import sandbox_worker
from grpo_stream.rewards.calls import Call, Chunk, GroupCalls, ScoreResult
from grpo_stream.rewards.failures import FailureLog
from grpo_stream.rewards.sandbox_worker import FLUSH_S
from grpo_stream.sandbox.pool import (
    BAD_REPLY,
    STOP_GRACE_S,
    PoolOwner,
    Worker,
    WorkerCode,
    WorkerPool,
)
from grpo_stream.sandbox.worker import pack as _pack

log = structlog.get_logger()

_MAX_REPLY_BYTES = 1 << 20  # a reply: at most FLUSH_ITEMS results, each with a short cause
# and at most one traceback of failures.MAX_TRACE_CHARS
_WORKER_KINDS = frozenset({"raised", "non_finite", "not_a_number", "unparseable"})
"""Failures a worker survives ("unparseable": a judge's output held no score)."""

RewardFn = Callable[..., float]


class RewardPoolError(RuntimeError):
    """The pool cannot serve: reward functions do not load, or workers do not start."""


# ---------------------------------------------------------------- parent side


@dataclass(eq=False)
class _Worker(Worker):
    chunk: Chunk | None = None
    answered: int = 0  # calls of the chunk whose result came back
    cpu_s: float = 0.0  # its CPU time since it loaded, as it last reported


class RewardPool(PoolOwner[_Worker]):
    """Worker processes that score completions with the configured reward functions."""

    def __init__(
        self,
        specs: list[RewardSpec],
        workers: int,
        timeout_s: float,
        memory_limit_mb: int,
        logger: Any = None,
    ) -> None:
        """`logger`: where its events go (a structlog logger; default this module's)."""
        if not specs:
            raise ValueError("RewardPool needs at least one reward spec")
        if workers < 1 or timeout_s <= 0 or memory_limit_mb < 1:
            raise ValueError("workers, timeout_s and memory_limit_mb must be positive")
        self._specs = list(specs)
        self._names = [spec.name for spec in specs]
        self._weights = np.array([spec.weight for spec in specs], dtype=np.float32)  # (C,)
        self._n_workers = workers
        self._timeout_s = timeout_s
        self._log = log if logger is None else logger
        code = WorkerCode(
            kind="reward",
            load=sandbox_worker.load,
            args=([spec.model_dump() for spec in self._specs],),
            memory_limit_mb=memory_limit_mb,
            setting=f"task.rewards = {self._names!r}",
            error=RewardPoolError,
            preload=(__name__, sandbox_worker.__name__),
            max_reply_bytes=_MAX_REPLY_BYTES,
        )
        self._pool = WorkerPool(code, workers, _Worker, logger=self._log)
        self._closed = False
        self._calls = 0
        self._failures: Counter[str] = Counter()
        self._failure_log = FailureLog(self._log)  # one failing reward must not flood the log
        self._groups: dict[int, GroupCalls] = {}  # submitted, not collected, by ticket
        self._queue: deque[Chunk] = deque()
        self._finished: list[int] = []  # tickets whose every call ended
        self._tickets = 0
        self._cpu_banked = 0.0  # CPU seconds of replaced workers
        self.completions = 0
        """Completions scored (every copy counts)."""

    # -- lifecycle

    def start(self) -> None:
        """Start the workers and wait until each has loaded the reward functions."""
        if self._closed or self._workers:
            raise RewardPoolError("RewardPool.start() may be called once, before close()")
        super().start()
        self._log.info("reward.pool_started", workers=self._n_workers, rewards=self._names)

    def close(self) -> None:
        """Stop every worker (SIGKILL after a grace period) and reap it. Idempotent."""
        self._closed = True
        super().close()

    @property
    def _workers(self) -> list[_Worker]:
        return self._pool.workers

    def stats(self) -> dict[str, Any]:
        """Counters: calls made, failures by cause, worker restarts."""
        return {
            "calls": self._calls,
            "failures": dict(self._failures),
            "restarts": self._pool.restarts,
            "workers": self._n_workers,
        }

    def cpu_s(self) -> float:
        """CPU seconds the workers spent since they loaded their rewards (replaced ones too,
        up to their last reply)."""
        return self._cpu_banked + sum(w.cpu_s for w in self._workers)

    # -- scoring

    def submit(self, prompt: str, completions: list[str], reference: dict[str, Any]) -> int:
        """Queue one group for scoring; its ticket comes back from `collect`."""
        if not self._workers:
            raise RewardPoolError("RewardPool is not started (call start() or use `with`)")
        group = GroupCalls(prompt, list(completions), _pack(reference), len(self._specs))
        ticket, self._tickets = self._tickets, self._tickets + 1
        self._groups[ticket] = group
        busy = len(self._queue) + sum(w.chunk is not None for w in self._workers)
        self._queue.extend(group.chunks(ticket, max(1, self._n_workers - busy)))
        self._check_done(ticket)
        return ticket

    def busy(self) -> bool:
        """Groups were submitted and are not collected yet."""
        return bool(self._groups)

    def collect(self, timeout_s: float) -> list[tuple[int, ScoreResult]]:
        """Run the queued calls, waiting up to `timeout_s` (inf: until something happens)
        for results; the groups finished since the last collect, with their tickets."""
        try:
            self._dispatch()
            running = any(w.chunk is not None for w in self._workers)
            if not self._finished and (running or self._queue):
                self._wait_for_events(timeout_s)
                self._dispatch()
        except RewardPoolError:
            self.close()  # a replacement worker cannot load its rewards: the pool is broken
            raise
        done, self._finished = self._finished, []
        return [(t, self._groups.pop(t).result(self._names, self._weights)) for t in done]

    def score(self, prompt: str, completions: list[str], reference: dict[str, Any]) -> ScoreResult:
        """Score every completion of one group with every reward component (no other group
        may be in flight)."""
        if self._groups:
            raise RewardPoolError("RewardPool.score while submitted groups are in flight")
        ticket = self.submit(prompt, completions, reference)
        while True:
            for done, result in self.collect(math.inf):
                if done == ticket:
                    return result

    def _dispatch(self) -> None:
        for w in self._workers:
            if not (w.ready and w.chunk is None and self._queue):
                continue
            chunk = self._queue.popleft()
            group = self._groups[chunk.group]
            calls = [[component, group.texts[u]] for component, u in chunk.calls]
            message = ["score", group.prompt, group.reference, calls]
            try:
                w.conn.send_bytes(_pack(message))
            except OSError:  # died while idle: nothing was running
                self._queue.appendleft(chunk)
                self._replace(w, "died while idle")
                continue
            w.chunk, w.answered = chunk, 0
            w.deadline = time.monotonic() + FLUSH_S + self._timeout_s

    # -- events

    def _wait_for_events(self, timeout_s: float) -> None:
        """Wait for a reply, a death or a deadline (at most `timeout_s`), and handle what
        happened."""
        now = time.monotonic()
        workers = list(self._workers)
        deadlines = [w.deadline for w in workers]  # a loading worker's: its startup's
        timeout = max(0.0, min([*deadlines, now + timeout_s]) - now)
        handles = [w.conn for w in workers] + [w.proc.sentinel for w in workers]
        wait(handles, None if math.isinf(timeout) else timeout)
        for w in workers:
            self._handle_worker(w)

    def _handle_worker(self, w: _Worker) -> None:
        while True:
            try:
                if not w.conn.poll():
                    break
                reply = self._pool.receive(w)
            except EOFError:  # the worker is gone; its sentinel fires as soon as it is reaped
                w.proc.join(STOP_GRACE_S)
                break
            except BAD_REPLY:
                self._lost(w, "protocol", "worker sent a malformed reply")
                return
            if not self._handle_reply(w, reply):
                return  # the worker was replaced
        if not w.proc.is_alive():
            self._on_death(w)
        elif not w.ready:
            self._pool.check_loading(w)  # past its startup deadline: raises
        elif w.chunk is not None and time.monotonic() >= w.deadline:
            self._lost(w, "timeout", f"timeout after {self._timeout_s}s")

    def _handle_reply(self, w: _Worker, reply: Any) -> bool:
        """Apply one reply; False when the worker had to be replaced."""
        if self._pool.handshake(w, reply):  # a replacement has loaded (or raises)
            return True
        chunk = w.chunk
        ok = isinstance(reply, list) and len(reply) == 4 and reply[0] == "results"
        if not (ok and chunk is not None and reply[1] == w.answered):
            self._lost(w, "protocol", "worker sent an unexpected reply")
            return False
        _, _, items, cpu_s = reply
        fits = isinstance(items, list) and len(items) <= len(chunk.calls) - w.answered
        if not (fits and isinstance(cpu_s, float)):
            self._lost(w, "protocol", "worker sent a malformed result")
            return False
        w.cpu_s = cpu_s
        for item in items:
            if not self._apply(w, chunk, item):
                return False
        w.deadline = time.monotonic() + FLUSH_S + self._timeout_s
        if w.answered == len(chunk.calls):
            w.chunk, w.deadline = None, math.inf
        return True

    def _apply(self, w: _Worker, chunk: Chunk, item: Any) -> bool:
        """One call's result item; False when the worker had to be replaced."""
        ok = isinstance(item, list) and len(item) == 5
        value, kind, cause, key, trace = item if ok else (None, None, None, None, None)
        call = chunk.calls[w.answered]
        if isinstance(value, float) and math.isfinite(value):
            self._calls += 1
            self._groups[chunk.group].put(call, value)
            self._check_done(chunk.group)
        elif kind == "memory":  # a worker that hit MemoryError may be in a bad state
            w.answered += 1
            self._fail(chunk.group, call, "memory", "memory limit")
            rest = chunk.calls[w.answered :]  # not run: back to the queue as they were
            if rest:
                self._queue.appendleft(Chunk(chunk.group, rest))
            w.chunk = None
            self._replace(w, "memory limit")
            return False
        elif kind in _WORKER_KINDS and all(isinstance(x, str) for x in (cause, key, trace)):
            self._fail(chunk.group, call, str(kind), str(cause), str(key), str(trace))
        else:
            self._lost(w, "protocol", "worker sent a malformed result")
            return False
        w.answered += 1
        return True

    def _on_death(self, w: _Worker) -> None:
        how = w.exit_cause()
        self._pool.check_loading(w)  # died while loading: raises
        if w.chunk is None:
            self._replace(w, f"died while idle ({how})")
        else:
            self._lost(w, "died", f"worker died ({how})")

    def _lost(self, w: _Worker, kind: str, cause: str) -> None:
        """The worker is lost while running its chunk and is replaced. One unanswered call:
        it was running, it fails. Several: each is retried alone (see the module doc)."""
        chunk, w.chunk = w.chunk, None
        if chunk is not None:
            rest = chunk.calls[w.answered :]
            if len(rest) == 1 or chunk.alone:
                self._fail(chunk.group, rest[0], kind, cause)
            else:
                alone = [Chunk(chunk.group, [call], alone=True) for call in rest]
                self._queue.extendleft(reversed(alone))
        self._replace(w, cause)

    def _fail(
        self, ticket: int, call: Call, kind: str, cause: str, key: str = "", trace: str = ""
    ) -> None:
        self._calls += 1
        self._failures[kind] += 1
        group = self._groups[ticket]
        name = self._names[call[0]]
        group.fail(call, name, cause)
        self._failure_log.record(name, group.copies[call[1]][0], kind, cause, key, trace)
        self._check_done(ticket)

    def _check_done(self, ticket: int) -> None:
        group = self._groups[ticket]
        if group.open == 0:
            self._finished.append(ticket)
            self.completions += group.values.shape[1]

    def _replace(self, w: _Worker, reason: str) -> None:
        self._cpu_banked += w.cpu_s  # its CPU time stays counted
        self._pool.replace(w, reason, wait_ready=False)  # it loads while the others serve
