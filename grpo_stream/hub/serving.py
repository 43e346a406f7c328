"""Answering the trainer ranks' batch requests.

A step is served once every one of its W ranks has asked for it and the replay buffer holds
`groups_per_step` groups fresh enough for the trainer's version: groups staler than
`max_staleness` are evicted first (counted stale if they were never used), the step's groups
are sampled, split W ways (rank r gets groups r, r+W, ...) and sent, one shard per rank.

Invariants: a group's first use is counted trained, exactly once; the ledger balances after
every step served; requests are answered in the order their steps were first asked for.

Exactly-once across crashes (see `grpo_stream.hub.journal`): a step's record is durable
before its shards are sent; a request asked again (same step, version and attempt: a lost
batch, or a hub restarted before the trainer got it) gets the same batch, never new
groups; a request for a step the hub already served with another key means the trainer
went back (it resumed from an older checkpoint, or skipped that step): the groups of those
steps were trained by a timeline that no longer exists and move from trained to discarded.
So `trained` always equals the groups in the trainer's surviving steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

from grpo_stream.config import HubSettings
from grpo_stream.hub.batches import build_step
from grpo_stream.hub.journal import SendJournal, Sent
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.payload_refs import build_ref_step
from grpo_stream.hub.replay import Group, ReplayBuffer
from grpo_stream.protocols import messages as m

log = structlog.get_logger()

Send = Callable[[bytes, m.Message], object]
Stats = Callable[[list[Group]], m.StepStats]
HISTORY_STEPS = 4096  # served steps remembered to reconcile a trainer that went back


class BatchDesk:
    """Pending BatchRequests, by the identity of the rank that sent each."""

    def __init__(
        self,
        hub: HubSettings,
        ledger: Ledger,
        buffer: ReplayBuffer,
        send: Send,
        stats: Stats,
        journal: SendJournal | None = None,
    ) -> None:
        self.hub = hub
        self.ledger = ledger
        self.buffer = buffer
        self.send = send
        self.stats = stats  # the step's statistics, computed once per step served
        self.journal = journal
        self.pending: deque[tuple[bytes, m.BatchRequest]] = deque()
        self.seq = 0  # sequence number of the last step served
        self.last: Sent | None = None  # the last step served, to answer a repeated request
        self.history: deque[tuple[int, list[int]]] = deque(maxlen=HISTORY_STEPS)

    def add(self, identity: bytes, request: m.BatchRequest) -> None:
        """A rank's request; its version is what the trainer is at (the ledger's to know)."""
        self.ledger.observe_trainer(request.trainer_version)
        if self.last is not None and self.last.answers(request):
            self.send(identity, self.last.shard(request.rank))  # idempotent: the same batch
            log.info(
                "batch.resent",
                step=request.step,
                rank=request.rank,
                seq=self.last.seq,
                groups=self.last.groups,
            )
            return
        self._went_back(request.step)
        if any(i == identity and r == request for i, r in self.pending):
            return  # asked again while still waiting
        # a rank waits for one step at a time: a new request replaces its older one
        self.pending = deque((i, r) for i, r in self.pending if i != identity)
        self.pending.append((identity, request))

    def _went_back(self, step: int) -> None:
        """The trainer asks for a step already served: the steps from there on were trained
        by a timeline it discarded."""
        gone = [groups for served, groups in self.history if served >= step]
        if not gone:
            return
        self.history = deque(((s, g) for s, g in self.history if s < step), maxlen=HISTORY_STEPS)
        n = sum(len(groups) for groups in gone)
        self.ledger.discard_trained(n)
        if self.last is not None and self.last.step >= step:
            self.last = None
        log.warning("batch.timeline_discarded", from_step=step, steps=len(gone), groups=n)

    def drop(self, identity: bytes) -> None:
        """Forget what a lost rank asked for (it asks again when it rejoins)."""
        self.pending = deque((i, r) for i, r in self.pending if i != identity)

    def serve(self) -> None:
        """Serve every step whose ranks have all asked and whose groups are ready."""
        while self.pending:
            _, head = self.pending[0]
            world = max(1, head.world_size)
            ranks = {r.rank: ident for ident, r in self.pending if r.step == head.step}
            if len(ranks) < world:
                return
            for g in self.buffer.evict_stale(self.ledger.is_stale):
                if g.uses == 0:
                    self.ledger.finish(g.group_id, "stale")
            ready = self.buffer.ready(self.ledger.is_stale)
            if ready < self.hub.groups_per_step:
                return
            self.pending = deque((i, r) for i, r in self.pending if r.step != head.step)
            self._send_step(head, ranks, world)

    def _send_step(self, head: m.BatchRequest, ranks: dict[int, bytes], world: int) -> None:
        sampled = self.buffer.sample(self.hub.groups_per_step, self.ledger.is_stale)
        for g, first in zip(sampled.groups, sampled.first_use, strict=True):
            if first:
                self.ledger.finish(g.group_id, "trained")
        self.ledger.check_invariant()
        build = build_ref_step if self.hub.payloads == "direct" else build_step
        shards = build(head.step, sampled.groups, self.stats(sampled.groups), world)
        seqs = shards[0].totals.num_seqs
        ids = [g.group_id for g in sampled.groups]
        record = Sent.of(self.seq + 1, head, ids, list(sampled.first_use), shards)
        if self.journal is not None:
            self.journal.append(record)  # durable before it leaves
        self._served(record)
        log.info(
            "batch.sent",
            step=head.step,
            trainer_version=head.trainer_version,
            groups=ids,
            sequences=seqs,
            seq=record.seq,
        )
        for rank, batch in enumerate(shards):
            self.send(ranks[rank], batch)

    def _served(self, record: Sent) -> None:
        self.seq = record.seq
        self.last = record
        self.history.append((record.step, record.first_uses()))
        self.ledger.step_served(record.version)

    def unserve(self, step: int, version: int, attempt: int) -> list[int] | None:
        """The trainer could not build the last step served (hub.payloads = "direct": a
        payload was lost): forget it; returns its first uses (for the ledger to generate
        again), or None if (step, version, attempt) is not the last step served."""
        last = self.last
        if last is None or (step, version, attempt) != (last.step, last.version, last.attempt):
            return None
        self.last = None
        if self.history and self.history[-1][0] == last.step:
            self.history.pop()
        return last.first_uses()

    # ----- restore ----------------------------------------------------------------------
    def replay(self, record: Sent) -> None:
        """Apply a journal record the restored checkpoint does not cover."""
        if record.seq <= self.seq:
            return
        self._went_back(record.step)
        self.buffer.mark_used(record.groups)
        self.ledger.replay_trained(record.first_uses())
        self._served(record)

    def state(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "last": None if self.last is None else self.last.to_state(),
            "history": [[step, groups] for step, groups in self.history],
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.seq = int(state["seq"])
        last = state["last"]
        self.last = None if last is None else Sent.from_state(last)
        self.history = deque(
            ((int(s), [int(g) for g in groups]) for s, groups in state["history"]),
            maxlen=HISTORY_STEPS,
        )
