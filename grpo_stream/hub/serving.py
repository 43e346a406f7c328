"""Answering the trainer ranks' batch requests.

A step is served once every one of its W ranks has asked for it and the replay buffer holds
`groups_per_step` groups fresh enough for the trainer's version: groups staler than
`max_staleness` are evicted first (counted stale if they were never used), the step's groups
are sampled, split W ways (rank r gets groups r, r+W, ...) and sent, one shard per rank.

Invariants: a group's first use is counted trained, exactly once; the ledger balances after
every step served; requests are answered in the order their steps were first asked for.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

from grpo_stream.config import HubSettings
from grpo_stream.hub.batches import build_batch
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.replay import Group, ReplayBuffer
from grpo_stream.protocols import messages as m

log = structlog.get_logger()

Send = Callable[[bytes, m.Message], object]
Stats = Callable[[list[Group]], dict[str, Any]]


class BatchDesk:
    """Pending BatchRequests, by the identity of the rank that sent each."""

    def __init__(
        self, hub: HubSettings, ledger: Ledger, buffer: ReplayBuffer, send: Send, stats: Stats
    ) -> None:
        self.hub = hub
        self.ledger = ledger
        self.buffer = buffer
        self.send = send
        self.stats = stats  # the step's statistics, computed once per step served
        self.pending: deque[tuple[bytes, m.BatchRequest]] = deque()

    def add(self, identity: bytes, request: m.BatchRequest) -> None:
        self.pending.append((identity, request))

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
            for g in self.buffer.evict_stale(head.trainer_version, self.hub.max_staleness):
                if g.uses == 0:
                    self.ledger.finish(g.group_id, "stale")
            ready = self.buffer.ready(head.trainer_version, self.hub.max_staleness)
            if ready < self.hub.groups_per_step:
                return
            self.pending = deque((i, r) for i, r in self.pending if r.step != head.step)
            self._send_step(head, ranks, world)

    def _send_step(self, head: m.BatchRequest, ranks: dict[int, bytes], world: int) -> None:
        sampled = self.buffer.sample(
            self.hub.groups_per_step, head.trainer_version, self.hub.max_staleness
        )
        for g, first in zip(sampled.groups, sampled.first_use, strict=True):
            if first:
                self.ledger.finish(g.group_id, "trained")
        self.ledger.check_invariant()
        stats = self.stats(sampled.groups)
        shards = [
            build_batch(head.step, sampled.groups[r::world], head.trainer_version, stats)
            for r in range(world)
        ]
        seqs = sum(len(b.advantages) for b in shards)
        tokens = sum(len(b.behaviour_logprobs) for b in shards)
        log.info(
            "batch.sent",
            step=head.step,
            trainer_version=head.trainer_version,
            groups=[g.group_id for g in sampled.groups],
            sequences=seqs,
        )
        for rank, batch in enumerate(shards):
            batch.stats.update(num_seqs_total=seqs, num_tokens_total=tokens)
            self.send(ranks[rank], batch)
        self.ledger.next_version = head.trainer_version + 1
