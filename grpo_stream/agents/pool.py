"""Where agent code runs: worker processes owned by the generator, isolated like reward and
environment code (`grpo_stream.envs.sandbox`: fork server, address-space cap, SIGKILL).

An agent is user code that talks to the endpoint over HTTP, so it runs beside the generator
in env.workers processes (`grpo_stream.agents.worker`), each running its share of a batch's
agents (key mod workers) concurrently on one event loop. Limits:
- time: env.agent_timeout_s of the agent's own time (the generator times it, not counting
  its requests' waits for the model); past it the agent is cancelled, and a worker that does
  not confirm within CANCEL_GRACE_S (an agent spinning on the CPU blocks its event loop) is
  killed and replaced;
- CPU: env.agent_cpu_s per episode of the batch, as the worker's RLIMIT_CPU;
- memory: env.memory_limit_mb of address space past its size after loading.

Invariants: every launched key gets exactly one result, `(key, reward, None)` or
`(key, None, cause)`; a worker that dies or is killed fails every episode it still ran
(never continued elsewhere) and is replaced before the next batch; nothing a worker sends
is unpickled.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import structlog

from grpo_stream.agents.worker import worker_main
from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.sandbox import EnvPoolError, kill_worker, start_worker
from grpo_stream.rewards.sandbox_worker import pack, unpack

log = structlog.get_logger()

CANCEL_GRACE_S = 1.0
"""How long a worker has to confirm a cancel before it is killed."""
_MAX_REPLY_BYTES = 1 << 16
_STOP_GRACE_S = 1.0

OPENAI_MODULES = ["openai", "openai.resources.chat", "openai.resources.completions",
                  "openai.resources.models"]  # fmt: skip
"""Imported once by the fork server: the client and the resources it imports lazily."""

Result = tuple[int, float | None, str | None]
"""(episode key, reward, None) or (key, None, why it failed)."""


@dataclass
class _Worker:
    slot: int
    proc: multiprocessing.process.BaseProcess
    conn: Connection
    keys: set[int] = field(default_factory=set)  # episodes whose agent runs here
    cancelled: dict[int, str] = field(default_factory=dict)
    kill_at: float | None = None  # a cancel not confirmed by then kills the worker


class AgentPool:
    """Worker processes running agents."""

    def __init__(self, settings: EnvSettings) -> None:
        if settings.agent is None:
            raise ValueError("AgentPool needs env.agent")
        self.settings = settings
        self._ctx = multiprocessing.get_context("forkserver")
        self._workers: list[_Worker] = []
        self.restarts = 0

    def start(self) -> None:
        """Start the workers and wait until each has loaded the agent."""
        # the client library too: importing openai takes seconds, once in the fork server
        # rather than in every worker (without effect if the fork server already runs)
        client = [*OPENAI_MODULES, "httpx"] if self.settings.agent_client == "openai" else []
        self._ctx.set_forkserver_preload([__name__, "grpo_stream.agents.worker", *client])
        try:
            self._workers = [self._spawn(slot) for slot in range(self.settings.workers)]
        except BaseException:
            self.close()
            raise
        log.info("agent.pool_started", agent=self.settings.agent, workers=len(self._workers))

    def _spawn(self, slot: int) -> _Worker:
        args = (self.settings.model_dump(mode="json"), list(sys.path))
        where = f"env.agent = {self.settings.agent!r}"
        proc, conn = start_worker(self._ctx, worker_main, args, f"agent-worker-{slot}", where)
        return _Worker(slot, proc, conn)

    def close(self) -> None:
        """Stop every worker (SIGKILL after a grace period). Idempotent."""
        for w in self._workers:
            with contextlib.suppress(OSError):
                w.conn.send_bytes(pack(["stop"]))
        end = time.monotonic() + _STOP_GRACE_S
        for w in self._workers:
            w.proc.join(max(0.0, end - time.monotonic()))
            kill_worker(w.proc)
            w.conn.close()
        self._workers = []

    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers if w.proc.pid is not None]

    def conns(self) -> list[Connection]:
        return [w.conn for w in self._workers]

    # ---- a batch ----------------------------------------------------------------------

    def launch(self, jobs: dict[int, tuple[str, dict[str, Any]]]) -> list[Result]:
        """Start one agent per key with (its endpoint URL, its task row); results of keys
        whose worker could not take them (it died since the last batch)."""
        if not self._workers:
            raise EnvPoolError("AgentPool is not started (call start())")
        by_slot: dict[int, list[list[Any]]] = {}
        for key, (url, task) in jobs.items():
            by_slot.setdefault(key % len(self._workers), []).append([key, url, task])
        failed: list[Result] = []
        for slot, batch in by_slot.items():
            w = self._workers[slot]
            w.keys.update(int(job[0]) for job in batch)
            try:
                w.conn.send_bytes(pack(["run", batch, self.settings.agent_cpu_s * len(batch)]))
            except OSError:
                failed += self._replace(w, "agent worker died")
        return failed

    def collect(self, ready: list[Any]) -> list[Result]:
        """Results the workers whose pipes are in `ready` sent (a dead one fails its keys)."""
        out: list[Result] = []
        for w in list(self._workers):
            if w.conn not in ready:
                continue
            try:
                while w.conn.poll(0):
                    reply = unpack(w.conn.recv_bytes(_MAX_REPLY_BYTES))
                    if not _well_formed(reply, w.keys):
                        out += self._replace(w, "agent worker sent a malformed reply")
                        break
                    out += self._result(w, reply)
            except (EOFError, OSError, ValueError):
                out += self._replace(w, self._death_cause(w))
        return out

    def _result(self, w: _Worker, reply: list[Any]) -> list[Result]:
        key = int(reply[1])
        w.keys.discard(key)
        cause = w.cancelled.pop(key, None)
        if not w.cancelled:
            w.kill_at = None
        if cause is not None:
            return [(key, None, cause)]
        if reply[0] == "done":
            return [(key, float(reply[2]), None)]
        return [(key, None, str(reply[2]))]

    def cancel(self, key: int, cause: str) -> None:
        """Stop one agent (its worker must confirm within CANCEL_GRACE_S)."""
        for w in self._workers:
            if key in w.keys:
                w.cancelled[key] = cause
                w.kill_at = w.kill_at or time.monotonic() + CANCEL_GRACE_S
                with contextlib.suppress(OSError):
                    w.conn.send_bytes(pack(["cancel", [key], cause]))

    def due(self) -> float | None:
        """When the earliest unconfirmed cancel kills its worker (None: none waits)."""
        times = [w.kill_at for w in self._workers if w.kill_at is not None]
        return min(times) if times else None

    def check(self, now: float) -> list[Result]:
        """Kill the workers whose cancels were not confirmed in time; their episodes fail."""
        out: list[Result] = []
        for w in list(self._workers):
            if w.kill_at is not None and now >= w.kill_at:
                why = "; ".join(sorted(set(w.cancelled.values())))
                cause = f"agent worker replaced: an agent on it did not stop ({why})"
                out += self._replace(w, cause)
        return out

    def _replace(self, w: _Worker, cause: str) -> list[Result]:
        """Kill a worker in doubt, fail what it ran, start a fresh one."""
        lost: list[Result] = [(k, None, w.cancelled.get(k, cause)) for k in sorted(w.keys)]
        w.keys.clear()
        kill_worker(w.proc)
        w.conn.close()
        self.restarts += 1
        log.warning("agent.worker_replaced", slot=w.slot, cause=cause, episodes_lost=len(lost))
        self._workers[w.slot] = self._spawn(w.slot)
        return lost

    def _death_cause(self, w: _Worker) -> str:
        w.proc.join(1.0)
        code = w.proc.exitcode
        if code == -signal.SIGXCPU:
            return f"agent worker exceeded env.agent_cpu_s={self.settings.agent_cpu_s} per episode"
        if code == -signal.SIGKILL:
            return "agent worker killed (out of memory?)"
        return f"agent worker died (exit code {code})"


def _well_formed(reply: Any, keys: set[int]) -> bool:
    """`["done", key, reward]` or `["error", key, cause]` for a key the worker runs."""
    if not (isinstance(reply, list) and len(reply) == 3 and reply[0] in ("done", "error")):
        return False
    return isinstance(reply[1], int) and reply[1] in keys
