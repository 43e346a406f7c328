"""Where environment code runs: worker processes owned by the generator, with a timeout per
call and a memory limit, exactly like reward code in the scorer (`grpo_stream.rewards.sandbox`).

Why in the generator and not in the scorer: an environment answers every turn, and the next
turn cannot be sampled before it has. Calling the scorer through the hub would put two network
hops and a hub lease in every turn of every episode, and episodes would need a new kind of
hub state (a half-played episode held by two services). A worker pipe next to the engine costs
microseconds, and an episode stays one unit of work from the hub's point of view: one
PromptBatch out, one Rollout back, with the environment's rewards inside (the hub then needs
no scorer for it). The isolation is the reward sandbox's (`grpo_stream.sandbox`): same fork
server, same address-space cap, same SIGKILL on a timeout; the generator process never runs
environment code.

Invariants:
- every call (`reset`, `step`) yields a result or an error line for its episode; an
  environment that raises, hangs past `env.timeout_s`, exhausts its memory, dies, or returns
  something other than a `Step` of text never takes the pool (or the generator) down;
- a worker in doubt is SIGKILLed, reaped and replaced; the episodes it held lose their state,
  so each of them fails too ("environment worker replaced"): a failed episode is never
  continued against a fresh environment that did not see its history;
- episodes are assigned to workers by key (key mod workers); `step()` is not thread-safe.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait
from typing import Any

import structlog

from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs import worker
from grpo_stream.envs.base import Step
from grpo_stream.ratelimit import RateLimit
from grpo_stream.sandbox.pool import BAD_REPLY, PoolOwner, Worker, WorkerCode, WorkerPool
from grpo_stream.sandbox.worker import Handler

log = structlog.get_logger()

_MAX_REPLY_BYTES = 1 << 20  # an observation is text: a megabyte is far past any budget


class EnvPoolError(RuntimeError):
    """The pool cannot serve: the environment does not load, or workers do not start."""


@dataclass(frozen=True)
class Answer:
    """The result of one call: a Step, or the error that failed the episode."""

    step: Step | None
    error: str | None = None


@dataclass(eq=False)
class _Worker(Worker):
    keys: set[int] = field(default_factory=set)  # live episodes held


class EnvPool(PoolOwner[_Worker]):
    """Worker processes holding the environments of live episodes."""

    def __init__(self, settings: EnvSettings) -> None:
        self.settings = settings
        code = env_code("env", worker.load, settings, f"env.name = {settings.name!r}")
        code = replace(code, preload=(__name__, worker.__name__), max_reply_bytes=_MAX_REPLY_BYTES)
        self._pool = WorkerPool(code, settings.workers, _Worker)
        self.warn = RateLimit()  # a broken environment fails every episode: fold the events

    def start(self) -> None:
        """Start the workers and wait until each has loaded the environment."""
        super().start()
        log.info("env.pool_started", env=self.settings.name, workers=self.settings.workers)

    # -- calls

    def reset(self, episodes: dict[int, tuple[str, dict[str, Any]]]) -> dict[int, Answer]:
        """Start one environment per episode key from its (prompt, reference)."""
        return self._run({k: ["reset", k, p, r] for k, (p, r) in episodes.items()})

    def step(self, actions: dict[int, str]) -> dict[int, Answer]:
        """Answer each live episode's action."""
        return self._run({k: ["step", k, a] for k, a in actions.items()})

    def drop(self, keys: list[int]) -> None:
        """Forget the environments of episodes that ended outside the environment's say."""
        for w in self._pool.workers:
            mine = [k for k in keys if k in w.keys]
            w.keys.difference_update(mine)
            if mine:
                w.send(["drop", mine])

    def _run(self, calls: dict[int, list[Any]]) -> dict[int, Answer]:
        workers = self._pool.workers
        if not workers:
            raise EnvPoolError("EnvPool is not started (call start() or use `with`)")
        answers: dict[int, Answer] = {}
        pending: dict[int, list[int]] = {}  # slot -> keys awaiting an answer, in call order
        for key, call in calls.items():
            w = workers[key % len(workers)]
            pending.setdefault(w.slot, []).append(key)
            if call[0] == "reset":
                w.keys.add(key)
        for slot, keys in pending.items():
            self._send(workers[slot], [calls[k] for k in keys], keys, answers)
        while any(pending.values()):
            self._wait(pending, answers)
        return answers

    def _send(
        self, w: _Worker, calls: list[list[Any]], keys: list[int], answers: dict[int, Answer]
    ) -> None:
        w.deadline = time.monotonic() + self.settings.timeout_s
        if not w.send(["calls", calls]):  # the worker died since its last call
            self._replace(w, keys, "environment worker died", answers)
            keys.clear()

    def _wait(self, pending: dict[int, list[int]], answers: dict[int, Answer]) -> None:
        live = [self._pool.workers[s] for s, keys in pending.items() if keys]
        timeout = max(0.0, min(w.deadline for w in live) - time.monotonic())
        ready = wait([w.conn for w in live], timeout)
        now = time.monotonic()
        for w in live:
            keys = pending[w.slot]
            if w.conn in ready:
                reply = self._receive(w)
                if reply is None or reply[1] != keys[0]:
                    self._replace(w, keys, "environment worker died", answers)
                    keys.clear()
                    continue
                key = keys.pop(0)
                answers[key] = _answer(reply)
                if answers[key].error is not None or (answers[key].step or Step()).done:
                    w.keys.discard(key)
                w.deadline = now + self.settings.timeout_s if keys else math.inf
            elif now >= w.deadline:
                cause = f"environment call exceeded env.timeout_s={self.settings.timeout_s}"
                answers[keys[0]] = Answer(None, cause)
                w.keys.discard(keys[0])
                self._replace(w, keys[1:], "environment worker replaced", answers)
                keys.clear()

    def _receive(self, w: _Worker) -> list[Any] | None:
        try:
            reply = self._pool.receive(w)
        except BAD_REPLY:
            return None
        ok = isinstance(reply, list) and len(reply) >= 3 and reply[0] in ("ok", "error")
        return reply if ok else None

    def _replace(self, w: _Worker, keys: list[int], cause: str, answers: dict[int, Answer]) -> None:
        """Kill a worker in doubt, fail the calls it still owed, start a fresh worker. The
        episodes it held that already got this turn's answer fail at their next step (the
        fresh worker holds no environment for them)."""
        for key in keys:
            answers[key] = Answer(None, cause)
        self._pool.replace(w, cause, episodes_lost=len(w.keys))


def env_code(
    kind: str, load: Callable[..., Handler], settings: EnvSettings, setting: str
) -> WorkerCode:
    """The code of a sandbox the generator owns (environments, agents): `load` run on the
    run's env settings, within env.memory_limit_mb, EnvPoolError naming `setting`."""
    return WorkerCode(
        kind=kind,
        load=load,
        args=(settings.model_dump(mode="json"),),
        memory_limit_mb=settings.memory_limit_mb,
        setting=setting,
        error=EnvPoolError,
    )


def _answer(reply: list[Any]) -> Answer:
    if reply[0] == "error":
        return Answer(None, str(reply[2]))
    _, _, observation, reward, done = reply
    if not isinstance(observation, str) or not isinstance(done, bool):
        return Answer(None, "environment reply is malformed")
    value = float(reward)
    if not math.isfinite(value):
        return Answer(None, f"non-finite reward {value}")
    return Answer(Step(observation, value, done))
