"""Handing work to the services that asked for it (credits), within the staleness gate and
each generator's share of the work.

Invariants: nothing goes to a peer without credits. What the gate lets out goes, a batch at
a time, to the generator that would finish it first: the smallest (prompts it holds + 1) /
its share (shares stand for speed: measured tokens/s once reported, else the device score).
So a generator twice as fast holds, and over a run gets, about twice the prompts; a slower
one gets work as soon as the faster ones' queues would take longer than it, so no device
idles while that would help. When the generator that would finish first has no credits
left, the prompts wait for it (it asks again when it finishes a batch) instead of going to
a slower one.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from typing import Protocol

import numpy as np

from grpo_stream.config import GeneratorSettings, RunConfig
from grpo_stream.hub.leases import Lease
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.registry import Peer, Registry
from grpo_stream.hub.shares import ShareBook
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.distill import TeachRequest
from grpo_stream.tasks import Task

Send = Callable[[bytes, m.Message], object]
Take = Callable[[str, float], tuple[Lease, int] | None]
"""The ledger's lease of the oldest waiting group to a holder at a time (None: none waits)."""


class Teachers(Protocol):
    """Distillation: builds the request of a group held for a teacher
    (`grpo_stream.hub.distill.Teaching`)."""

    def request(self, lease_id: int, group_id: int) -> TeachRequest: ...


class ScoreRefs(Protocol):
    """hub.payloads = "direct": builds the request pointing a scorer at a group's payload
    (`grpo_stream.hub.payloads.direct.DirectPayloads`)."""

    def score_request(self, lease_id: int, group_id: int) -> m.Message: ...


SHARES_EVERY_S = 1.0
"""Longest time dispatch uses the same shares while the same generators are connected
(throughput reports arrive with heartbeats, about one per second per generator)."""


def allocate(
    gens: list[Peer], shares: dict[str, float], held: Counter[str], available: int, batch: int
) -> dict[str, int]:
    """How many of `available` prompts each generator (by instance) gets, in batches of at
    most `batch` (shortest expected delay; see the module doc). `held`: prompts each holds.
    Generators that never asked for work (still loading their model) are left out.

    A heap of (expected delay, position) picks the first to finish, ties to the earlier
    generator in `gens`: O((generators + batches) log generators), not one scan per batch."""
    out: dict[str, int] = {}
    heap = [
        ((held[p.instance] + 1) / max(shares.get(p.instance, 0.0), 1e-9), i, p)
        for i, p in enumerate(gens)
        if p.credits > 0 or held[p.instance] > 0
    ]
    heapq.heapify(heap)
    left = available
    while left > 0 and heap:
        _, i, first = heap[0]
        given = out.get(first.instance, 0)
        give = min(first.credits - given, batch, left)
        if give <= 0:
            break  # the fastest to finish is full: the rest waits for its next request
        out[first.instance] = given + give
        left -= give
        queued = held[first.instance] + out[first.instance]
        delay = (queued + 1) / max(shares.get(first.instance, 0.0), 1e-9)
        heapq.heapreplace(heap, (delay, i, first))
    return out


def lease_base(cfg: RunConfig) -> int:
    """Prompts of one lease before refill planning: generator.prompts_per_request when set,
    else a trainer step's (hub.groups_per_step)."""
    return cfg.generator.prompts_per_request or cfg.hub.groups_per_step


def largest_lease(cfg: RunConfig) -> int:
    """The most prompts one lease can hold: the base, and with hub.refill_ahead the
    replacements of a step whose every group may be refilled (at most 1 + max_refill_ratio
    prompts a slot, `Refill.per_slot`)."""
    base = lease_base(cfg)
    if not (cfg.hub.refill_ahead and cfg.algo.advantage.filter_zero_signal):
        return base
    return math.ceil(base * (1.0 + cfg.hub.max_refill_ratio) - 1e-9)


def sampling_params(g: GeneratorSettings) -> m.SamplingParams:
    """The run's sampling, as the hub leases it in every PromptBatch."""
    return m.SamplingParams(temperature=g.temperature, top_p=g.top_p, max_tokens=g.max_tokens)


class Dispatcher:
    """Turns credits into PromptBatch and ScoreRequest messages."""

    def __init__(
        self,
        cfg: RunConfig,
        ledger: Ledger,
        registry: Registry,
        shares: ShareBook,
        task: Task,
        send: Send,
    ) -> None:
        self.cfg = cfg
        self.ledger = ledger
        self.registry = registry
        self.shares = shares
        self.task = task
        self.send = send
        self.dispatched: Counter[str] = Counter()  # prompts handed to each generator
        self._shares: tuple[float, list[str], dict[str, float]] = (-1.0, [], {})

    def generators(self, now: float, excluded: Collection[str] = ()) -> None:
        """Lease prompts to generators with credits (none to the `excluded`: quarantined)."""
        available = len(self.ledger.retry) + self.ledger.pipeline().capacity()
        if available <= 0:
            return
        gens = [p for p in self.registry.of("generator") if p.instance not in excluded]
        if not any(p.credits > 0 for p in gens):
            return
        shares = self._current_shares([p.instance for p in gens], now)
        by_name = {p.instance: p for p in gens}
        batch = self.ledger.refill.lease(lease_base(self.cfg), self.ledger.refill_ahead)
        held = self.ledger.leases.held_by()
        for name, count in allocate(gens, shares, held, available, batch).items():
            peer = by_name[name]
            taken = self.ledger.take_for_generation(peer.instance, count, now)
            if taken is None:
                return
            lease, min_version = taken
            self._send_prompts(peer, sorted(lease.group_ids), lease.lease_id, min_version)

    def _current_shares(self, instances: list[str], now: float) -> dict[str, float]:
        """The generators' shares, computed again when generators came or went, else at
        most every SHARES_EVERY_S (each takes a pass over every generator's throughput)."""
        at, names, shares = self._shares
        if names != instances or now - at >= SHARES_EVERY_S or now < at:
            shares = self.shares.shares(instances)
            self._shares = (now, instances, shares)
        return shares

    def _send_prompts(self, peer: Peer, ids: list[int], lease_id: int, min_version: int) -> None:
        problems = [self.task.problem(i) for i in ids]
        peer.credits -= len(ids)
        self.dispatched[peer.instance] += len(ids)
        g = self.cfg.generator
        self.send(
            peer.identity,
            m.PromptBatch(
                lease_id=lease_id,
                group_ids=np.array(ids, dtype=np.int64),
                prompts=[p.prompt for p in problems],
                references=[dict(p.reference) for p in problems],
                group_size=g.group_size,
                sampling=sampling_params(g),
                min_version=min_version,
            ),
        )

    def scorers(
        self, now: float, rollouts: dict[int, m.Rollout], refs: ScoreRefs | None = None
    ) -> None:
        """Lease groups to scorers with credits: their texts (ScoreRequest), or under
        hub.payloads = "direct" where to fetch them (`refs`: a ScoreRef)."""
        for peer, lease_id, gid in self._leases("scorer", self.ledger.take_for_scoring, now):
            if refs is not None:
                self.send(peer.identity, refs.score_request(lease_id, gid))
                continue
            problem = self.task.problem(gid)  # the hub's prompt and reference, never the
            self.send(  # generator's: a Rollout carries neither
                peer.identity,
                m.ScoreRequest(
                    lease_id=lease_id,
                    group_id=gid,
                    prompt=problem.prompt,
                    completions=list(rollouts[gid].texts),
                    reference=dict(problem.reference),
                ),
            )

    def teachers(self, now: float, teaching: Teachers) -> None:
        """Lease groups waiting for a teacher to teachers with credits, one group each."""
        for peer, lease_id, gid in self._leases("teacher", self.ledger.take_for_teaching, now):
            self.send(peer.identity, teaching.request(lease_id, gid))

    def _leases(self, service: str, take: Take, now: float) -> Iterator[tuple[Peer, int, int]]:
        """(peer, lease id, group id) for each group `take` leases to a `service` peer, one
        credit a group, while peers have credits and groups wait."""
        for peer in self.registry.of(service):
            while peer.credits > 0:
                taken = take(peer.instance, now)
                if taken is None:
                    return
                lease, gid = taken
                peer.credits -= 1
                yield peer, lease.lease_id, gid
