"""Handing work to the services that asked for it (credits), within the staleness gate and
each generator's share of the window.

Invariants: nothing goes to a peer without credits; a generator holds at most about
share x window prompts (at least one), where window = groups_per_step x (max_staleness + 1)
is all the gate lets out; the generator furthest below its share is served first.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np

from grpo_stream.config import RunConfig
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.registry import Peer, Registry
from grpo_stream.hub.shares import ShareBook
from grpo_stream.protocols import messages as m
from grpo_stream.tasks import Task

Send = Callable[[bytes, m.Message], object]


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

    def generators(self, now: float) -> None:
        gens = self.registry.of("generator")
        if not gens:
            return
        hub = self.cfg.hub
        window = hub.groups_per_step * (hub.max_staleness + 1)
        shares = self.shares.shares([p.instance for p in gens])
        held = self.ledger.held_by()
        # furthest below its share first
        gens.sort(key=lambda p: held[p.instance] - shares[p.instance] * window)
        for peer in gens:
            allowed = max(1, math.ceil(shares[peer.instance] * window)) - held[peer.instance]
            want = min(peer.credits, allowed)
            if want <= 0:
                continue
            taken = self.ledger.take_for_generation(peer.instance, want, now)
            if taken is None:
                return
            lease, min_version = taken
            self._send_prompts(peer, sorted(lease.group_ids), lease.lease_id, min_version)

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
                max_tokens=g.max_tokens,
                temperature=g.temperature,
                top_p=g.top_p,
                min_version=min_version,
            ),
        )

    def scorers(self, now: float, rollouts: dict[int, m.Rollout]) -> None:
        for peer in self.registry.of("scorer"):
            while peer.credits > 0:
                taken = self.ledger.take_for_scoring(peer.instance, now)
                if taken is None:
                    return
                lease, gid = taken
                ro = rollouts[gid]
                peer.credits -= 1
                self.send(
                    peer.identity,
                    m.ScoreRequest(
                        lease_id=lease.lease_id,
                        group_id=gid,
                        prompt=ro.prompt,
                        completions=list(ro.texts),
                        reference=dict(ro.reference),
                    ),
                )
