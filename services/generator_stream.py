"""The generator's streaming loop, for engines that take one request per prompt (the vllm
engine, `grpo_stream.engines.streaming.StreamingEngine`): every prompt of a PromptBatch is
submitted as it arrives, and each group goes to the hub the moment its G completions are done.

Invariants:
- Credits count prompts held: each prompt's credit goes back when its group is sent, so the
  generator never holds more prompts than it asked for, and the engine stays full across
  PromptBatches (vLLM batches requests of different leases together). The window grows with
  the engine's occupancy (`grpo_stream.services.credits.CreditWindow`).
- A PromptBatch is submitted once `Hooks.version_ready(min_version)` says the engine may
  take it; finished groups keep flowing to the hub while it waits.
- Weights are followed by the generator (`Hooks.turn`): a newer version starts a background
  fetch-and-apply (the engine pauses, loads and resumes vLLM itself); no turn blocks on it.
- Each group's request is seeded by the run's seed and its group id (`group_seed`): the same
  completions however the hub batched it.
- Each Rollout's per-token versions come from the engine (vLLM's spans): its policy_version
  is the oldest, and `gen_seconds` is the group's time from submission to done.
- On rejoin the hub re-dispatches what we held: the generator drops its queue and this loop
  aborts the running requests of those leases, so their groups never reach the hub.
- An engine that cannot go on raises EngineFailed out of `run`: the generator exits and `up`
  restarts it.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import structlog

from grpo_stream.engines.streaming import StreamingEngine, group_seed
from grpo_stream.protocols import messages as m
from grpo_stream.sampling import GroupSample, Sampling
from grpo_stream.services.credits import CreditWindow
from grpo_stream.session.service import Session

log = structlog.get_logger()

IDLE_WAIT_S = 0.05  # how long one turn waits for a finished group when nothing else is due
BUSY_WAIT_S = 0.005  # the same while a PromptBatch waits for its version


@dataclass(frozen=True)
class Hooks:
    """What the loop asks of its generator."""

    turn: Callable[[], None]
    """Read the hub's messages into the queue; follow the trainer's versions."""
    version_ready: Callable[[int], bool]
    """The engine may take a PromptBatch of this min_version now."""
    send: Callable[[m.PromptBatch, int, GroupSample, float], int]
    """Send one group's Rollout (batch, group id, group, seconds);
    returns its completion tokens."""
    account: Callable[[int, int, float, int], None]
    """Count (groups sent, tokens, busy seconds, PromptBatches started)."""
    waited: Callable[[float], None]
    """Count seconds spent with nothing to do."""


@dataclass(frozen=True)
class _Held:
    """One prompt being generated: where its Rollout goes."""

    batch: m.PromptBatch
    group_id: int


class StreamLoop:
    """Drives a StreamingEngine for one generator (see module docstring)."""

    def __init__(
        self,
        engine: StreamingEngine,
        link: Session,
        queue: deque[m.PromptBatch],
        seed: int,
        hooks: Hooks,
    ) -> None:
        self.engine = engine
        self.link = link
        self.queue = queue
        self.seed = seed
        self.hooks = hooks
        self.held: dict[Hashable, _Held] = {}
        self._tag = uuid.uuid4().hex[:8]  # keys never collide with an earlier loop's requests
        self._busy_since: float | None = None  # when the engine last went from idle to busy
        self.credits = CreditWindow(1)  # the generator's, from `run`
        link.on_rejoin(self._rejoined)

    def run(self, credits: CreditWindow) -> None:
        self.credits = credits
        self.link.pull(2 * credits.start)
        while not self.link.stop.set:
            idle = not self.held and not self.queue
            t0 = time.perf_counter()
            self.hooks.turn()
            started = self._submit_ready()
            wait = BUSY_WAIT_S if self.queue else IDLE_WAIT_S
            self._send(self.engine.take_finished(wait), started)
            if idle and not self.held:  # credits out, nothing to do
                self.hooks.waited(time.perf_counter() - t0)
        if self.held:  # stopped with requests running: nobody will send their groups
            self.engine.abort(set(self.held))

    def _submit_ready(self) -> int:
        """Submit the PromptBatches whose version the engine holds; how many."""
        started = 0
        while self.queue and self.hooks.version_ready(self.queue[0].min_version):
            batch = self.queue.popleft()
            rows = self.engine.encode(list(batch.prompts))
            for i, (gid, row) in enumerate(zip(batch.group_ids, rows, strict=True)):
                key = (self._tag, int(batch.lease_id), i)
                self.held[key] = _Held(batch, int(gid))
                sampling = Sampling.of(batch.sampling, group_seed(self.seed, int(gid)))
                self.engine.submit(key, row, batch.group_size, sampling)
            started += 1
            if self._busy_since is None:
                self._busy_since = time.perf_counter()
        return started

    def _send(self, finished: list[tuple[Hashable, GroupSample, float]], started: int) -> None:
        tokens = sent = asked = 0
        for key, sample, seconds in finished:
            held = self.held.pop(key, None)
            if held is None:  # its lease went back to the hub (a rejoin): not ours to send
                continue
            tokens += self.hooks.send(held.batch, held.group_id, sample, seconds)
            sent += 1
            asked += self.credits.done([len(c.token_ids) for c in sample.completions])
        if asked:
            self.link.replenish(asked)
        now = time.perf_counter()
        if self._busy_since is not None and (sent or started or not self.held):
            self.hooks.account(sent, tokens, now - self._busy_since, started)
            self._busy_since = now if self.held else None

    def _rejoined(self) -> None:
        """The hub re-dispatches everything we held: drop it, stop its requests."""
        if self.held:
            running = self.engine.abort(set(self.held))
            log.info("generator.requests_aborted", held=len(self.held), running=running)
        self.held.clear()
        self._busy_since = None
        self.credits.rejoined()
