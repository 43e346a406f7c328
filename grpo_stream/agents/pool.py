"""Where agent code runs: worker processes owned by the generator, isolated like reward and
environment code (`grpo_stream.sandbox`: fork server, address-space cap, SIGKILL).

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

import math
import signal
import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Any

import structlog

from grpo_stream.agents import worker
from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.sandbox import EnvPoolError, env_code
from grpo_stream.sandbox.pool import BAD_REPLY, PoolOwner, Worker, WorkerPool

log = structlog.get_logger()

CANCEL_GRACE_S = 1.0
"""How long a worker has to confirm a cancel before it is killed."""

OPENAI_MODULES = ["openai", "openai.resources.chat", "openai.resources.completions",
                  "openai.resources.models"]  # fmt: skip
"""Imported once by the fork server: the client and the resources it imports lazily."""

Result = tuple[int, float | None, str | None]
"""(episode key, reward, None) or (key, None, why it failed)."""


@dataclass(eq=False)
class _Worker(Worker):
    """Its `deadline`: a cancel not confirmed by then kills the worker."""

    keys: set[int] = field(default_factory=set)  # episodes whose agent runs here
    cancelled: dict[int, str] = field(default_factory=dict)


class AgentPool(PoolOwner[_Worker]):
    """Worker processes running agents."""

    def __init__(self, settings: EnvSettings) -> None:
        if settings.agent is None:
            raise ValueError("AgentPool needs env.agent")
        self.settings = settings
        # the client library too: importing openai takes seconds, once in the fork server
        # rather than in every worker
        client = [*OPENAI_MODULES, "httpx"] if settings.agent_client == "openai" else []
        code = env_code("agent", worker.load, settings, f"env.agent = {settings.agent!r}")
        code = replace(code, preload=(__name__, worker.__name__, *client))
        self._pool = WorkerPool(code, settings.workers, _Worker)

    def start(self) -> None:
        """Start the workers and wait until each has loaded the agent."""
        super().start()
        log.info("agent.pool_started", agent=self.settings.agent, workers=self._pool.count)

    def conns(self) -> list[Connection]:
        return [w.conn for w in self._pool.workers]

    # ---- a batch ----------------------------------------------------------------------

    def launch(self, jobs: dict[int, tuple[str, dict[str, Any]]]) -> list[Result]:
        """Start one agent per key with (its endpoint URL, its task row); results of keys
        whose worker could not take them (it died since the last batch)."""
        workers = self._pool.workers
        if not workers:
            raise EnvPoolError("AgentPool is not started (call start())")
        by_slot: dict[int, list[list[Any]]] = {}
        for key, (url, task) in jobs.items():
            by_slot.setdefault(key % len(workers), []).append([key, url, task])
        failed: list[Result] = []
        for slot, batch in by_slot.items():
            w = workers[slot]
            w.keys.update(int(job[0]) for job in batch)
            if not w.send(["run", batch, self.settings.agent_cpu_s * len(batch)]):
                failed += self._replace(w, "agent worker died")
        return failed

    def collect(self, ready: list[Any]) -> list[Result]:
        """Results the workers whose pipes are in `ready` sent (a dead one fails its keys)."""
        out: list[Result] = []
        for w in list(self._pool.workers):
            if w.conn not in ready:
                continue
            try:
                while w.conn.poll(0):
                    reply = self._pool.receive(w)
                    if not _well_formed(reply, w.keys):
                        out += self._replace(w, "agent worker sent a malformed reply")
                        break
                    out += self._result(w, reply)
            except BAD_REPLY:
                out += self._replace(w, self._death_cause(w))
        return out

    def _result(self, w: _Worker, reply: list[Any]) -> list[Result]:
        key = int(reply[1])
        w.keys.discard(key)
        cause = w.cancelled.pop(key, None)
        if not w.cancelled:
            w.deadline = math.inf
        if cause is not None:
            return [(key, None, cause)]
        if reply[0] == "done":
            return [(key, float(reply[2]), None)]
        return [(key, None, str(reply[2]))]

    def cancel(self, key: int, cause: str) -> None:
        """Stop one agent (its worker must confirm within CANCEL_GRACE_S)."""
        for w in self._pool.workers:
            if key in w.keys:
                w.cancelled[key] = cause
                w.deadline = min(w.deadline, time.monotonic() + CANCEL_GRACE_S)
                w.send(["cancel", [key], cause])

    def due(self) -> float | None:
        """When the earliest unconfirmed cancel kills its worker (None: none waits)."""
        return min((w.deadline for w in self._pool.workers if w.cancelled), default=None)

    def check(self, now: float) -> list[Result]:
        """Kill the workers whose cancels were not confirmed in time; their episodes fail."""
        out: list[Result] = []
        for w in list(self._pool.workers):
            if w.cancelled and now >= w.deadline:
                why = "; ".join(sorted(set(w.cancelled.values())))
                cause = f"agent worker replaced: an agent on it did not stop ({why})"
                out += self._replace(w, cause)
        return out

    def _replace(self, w: _Worker, cause: str) -> list[Result]:
        """Kill a worker in doubt, fail what it ran, start a fresh one."""
        lost: list[Result] = [(k, None, w.cancelled.get(k, cause)) for k in sorted(w.keys)]
        w.keys.clear()
        self._pool.replace(w, cause, episodes_lost=len(lost))
        return lost

    def _death_cause(self, w: _Worker) -> str:
        w.proc.join(1.0)
        code = w.proc.exitcode
        if code == -signal.SIGXCPU:
            return f"agent worker exceeded env.agent_cpu_s={self.settings.agent_cpu_s} per episode"
        if code == -signal.SIGKILL:
            return "agent worker killed (out of memory?)"
        return f"agent worker died ({w.exit_cause()})"


def _well_formed(reply: Any, keys: set[int]) -> bool:
    """`["done", key, reward]` or `["error", key, cause]` for a key the worker runs."""
    if not (isinstance(reply, list) and len(reply) == 3 and reply[0] in ("done", "error")):
        return False
    return isinstance(reply[1], int) and reply[1] in keys
