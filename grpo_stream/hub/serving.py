"""Answering the trainer ranks' batch requests.

A step is served once every one of its W ranks has asked for it and the replay buffer holds
`groups_per_step` groups fresh enough for the trainer's version (less the step's holes: slots
whose groups came back without signal once its refills were used up, see
`grpo_stream.hub.ledger`; such a step is served short): groups staler than
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

A batch that kills the trainer is not served again as is: when the rank-0 trainer died
(`trainer_died`) `crash_limit` times in a row holding the last step served, before asking for
the next, the repeated request gets new groups; the old ones end failed (`batch.poisoned`,
one error event) and the hub checkpoints, so its journal cannot count them trained again.
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
from grpo_stream.hub.ledger_state import replay_trained
from grpo_stream.hub.payloads.refs import build_ref_step
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
        crash_limit: int = 2,
        checkpoint: Callable[[], None] | None = None,
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
        self.crash_limit = crash_limit
        self.checkpoint = checkpoint
        self.deaths = 0  # rank-0 trainer deaths holding `last`, with no later step asked

    def refusal(self, request: m.BatchRequest, ranks: int) -> str | None:
        """Why `request` is beyond what the trainer can have asked (None: it is not): it
        must come from one of its `ranks` ranks, at most one step past the last served, at
        a version the ledger finds plausible (`Ledger.plausible_trainer_version`). A
        request refused here changes nothing (see `grpo_stream.hub.guard`)."""
        if not 0 <= request.rank < request.world_size <= ranks:
            return f"only the trainer's {ranks} rank(s) ask for batches"
        if request.step < 0 or request.trainer_version < 0 or request.attempt < 0:
            return "negative step, version or attempt"
        if self.last is None:
            return None  # nothing served yet (or forgotten): any resumed trainer is plausible
        if request.step > self.last.step + 1:
            return f"step {request.step}: the last step served is {self.last.step}"
        highest = self.ledger.versions.plausible_trainer_version()
        if request.trainer_version > highest:
            return f"version {request.trainer_version}: the trainer cannot be past {highest}"
        return None

    def add(self, identity: bytes, request: m.BatchRequest) -> None:
        """A rank's request; its version is what the trainer is at (the ledger's to know)."""
        self.ledger.versions.observe_trainer(request.trainer_version)
        if self.last is not None and request.step > self.last.step:
            self.deaths = 0  # the trainer got past the last step served
        if self.last is not None and self.last.answers(request) and self.deaths >= self.crash_limit:
            self._poison()
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
        self.ledger.counters.discard_trained(n)
        if self.last is not None and self.last.step >= step:
            self.last = None
        log.warning("batch.timeline_discarded", from_step=step, steps=len(gone), groups=n)

    def trainer_died(self) -> None:
        """The rank-0 trainer was lost or left without finishing the run."""
        if self.last is not None:
            self.deaths += 1

    def _poison(self) -> None:
        """The last step served killed the trainer `crash_limit` times: forget it; its first
        uses end failed, its groups leave the buffer; the repeat gets new groups."""
        last = self.last
        if last is None:
            return
        first = last.first_uses()
        self.ledger.counters.retract_trained(len(first))
        self.buffer.drop(set(last.groups))
        self.last = None
        if self.history and self.history[-1][0] == last.step:
            self.history.pop()
        log.error(
            "batch.poisoned",
            step=last.step,
            groups=list(last.groups),
            deaths=self.deaths,
            hint="the trainer died on this batch every time it got it: new groups instead",
        )
        self.deaths = 0
        if self.checkpoint is not None:
            self.checkpoint()

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
            for g in self.buffer.evict_stale(self.ledger.versions.is_stale):
                if g.uses == 0:
                    self.ledger.finish(g.group_id, "stale")
            ready = self.buffer.ready(self.ledger.versions.is_stale)
            if ready < self.ledger.refill.need():  # groups_per_step less the step's holes
                return
            self.pending = deque((i, r) for i, r in self.pending if r.step != head.step)
            self._send_step(head, ranks, world)

    def _send_step(self, head: m.BatchRequest, ranks: dict[int, bytes], world: int) -> None:
        sampled = self.buffer.sample(self.hub.groups_per_step, self.ledger.versions.is_stale)
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
            short=self.hub.groups_per_step - len(ids),  # dynamic sampling's holes
            sequences=seqs,
            seq=record.seq,
        )
        for rank, batch in enumerate(shards):
            self.send(ranks[rank], batch)

    def _served(self, record: Sent) -> None:
        self.seq = record.seq
        self.last = record
        self.history.append((record.step, record.first_uses()))
        self.ledger.step_served(record.version, len(record.groups))

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
        replay_trained(self.ledger, record.first_uses())
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
