"""Handing work to the services that asked for it (credits), within the staleness gate and
each generator's share of the work.

Invariants: nothing goes to a peer without credits; what the gate lets out goes first to the
generators furthest below their share of everything dispatched so far (deficit round robin),
so over a run each generator's part converges to its share; what is left goes to anyone with
credits, so no generator idles while prompts are available.
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


def allocate(
    gens: list[Peer], shares: dict[str, float], dispatched: Counter[str], available: int
) -> dict[str, int]:
    """How many prompts each generator (by instance) with credits gets out of `available`."""
    total = sum(dispatched[p.instance] for p in gens) + available
    need = {p.instance: shares.get(p.instance, 0.0) * total - dispatched[p.instance] for p in gens}
    out: dict[str, int] = {}
    left = available
    for peer in sorted(gens, key=lambda p: -need[p.instance]):
        give = min(peer.credits, max(0, math.ceil(need[peer.instance])), left)
        if give > 0:
            out[peer.instance] = give
            left -= give
    for peer in gens:  # capacity left: nobody waits while prompts are available
        give = min(peer.credits - out.get(peer.instance, 0), left)
        if give > 0:
            out[peer.instance] = out.get(peer.instance, 0) + give
            left -= give
    return out


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
        gens = [p for p in self.registry.of("generator") if p.credits > 0]
        if not gens:
            return
        available = len(self.ledger.retry) + self.ledger.capacity()
        shares = self.shares.shares([p.instance for p in self.registry.of("generator")])
        by_name = {p.instance: p for p in gens}
        for name, count in allocate(gens, shares, self.dispatched, available).items():
            peer = by_name[name]
            taken = self.ledger.take_for_generation(peer.instance, count, now)
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
