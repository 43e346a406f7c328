"""The hub's trust gate for results from authenticated peers: the lease a result names must
be its sender's, a Rollout's content must check out (`grpo_stream.hub.content`), and a
generator is quarantined when the trainer's evidence shows its rollouts come from another
model (`grpo_stream.hub.verify`) or when `security.verify.max_bad_rollouts` of its rollouts
were refused for what no honest sampler sends (`bad_rollout`: impossible numbers, lengths
that disagree, episodes the run does not play, environment turns the environment did not
say), counted per generator.

Invariants:
- a result refused here changes nothing but the refusing peer's leases: what it held goes
  back to the ledger at once, so another peer does the work (the grouper logs one error
  event per refusal, rate-limited, `guard.TRUST`);
- a quarantined generator gets no work and none of its results is taken; the groups it
  generated that are not trained yet are generated again by others, and it stays connected
  and idle (a refusal to join would make `up` restart it until the run fails).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import structlog

from grpo_stream.config import RunConfig
from grpo_stream.hub.content import ContentCheck
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.registry import Peer
from grpo_stream.hub.replay import ReplayBuffer
from grpo_stream.hub.verify import Verifier
from grpo_stream.protocols import messages as m
from grpo_stream.tasks import Task

log = structlog.get_logger()

Refusal = tuple[str, str | None]
"""(code, why): why None when the result may be taken."""
Refuse = Callable[[bytes, str, str, str], None]
"""The grouper's refusal: (identity, code, reason, kind), counted, answered, logged."""


class TrustGate:
    """Lease holders, content checks and quarantine, for the grouper."""

    def __init__(
        self,
        cfg: RunConfig,
        task: Task,
        ledger: Ledger,
        buffer: ReplayBuffer,
        rollouts: dict[int, m.Rollout],
        refuse: Refuse,
        tokenizer: Any = None,
    ) -> None:
        self.cfg = cfg
        self.refuse = refuse
        self.ledger = ledger
        self.buffer = buffer
        self.rollouts = rollouts  # the grouper's: rollouts waiting for a score
        self.content = (
            ContentCheck.load(cfg, task, tokenizer) if cfg.security.check_content else None
        )
        self.verifier = Verifier(cfg.security.verify)
        self.bad_rollouts: Counter[str] = Counter()  # per generator: refused as impossible

    @property
    def quarantined(self) -> set[str]:
        return self.verifier.quarantined

    def holder(self, peer: Peer, lease_id: int, group_id: int, kind: str) -> Refusal:
        """Whether `peer` may deliver a result of `kind` on `group_id` under `lease_id`."""
        if peer.instance in self.verifier.quarantined:
            return "quarantined", f"{peer.instance} is quarantined"
        return "bad_lease", self.ledger.leases.issued_to(lease_id, group_id, peer.instance, kind)

    def lease(self, peer: Peer, msg: m.Rollout) -> Refusal:
        """Whether `peer` holds the lease its Rollout names (and is not quarantined)."""
        return self.holder(peer, msg.lease_id, msg.group_id, "generate")

    def rollout(self, peer: Peer, msg: m.Rollout) -> Refusal:
        """Whether the content of `peer`'s Rollout may be scored and trained."""
        if self.content is None:
            return "bad_content", None
        return "bad_content", self.content.check(msg, peer.instance)

    def admit(self, peer: Peer, kind: str, refusal: Refusal) -> bool:
        """Refuse a result that fails the gate (one error event); what its sender held goes
        back to the ledger at once, so another peer does the work."""
        code, why = refusal
        if why is None:
            return True
        self.refuse(peer.identity, code, why, kind)
        self.ledger.release_holder(peer.instance)
        return False

    def bad_rollout(self, peer: Peer, kind: str, why: str) -> None:
        """Refuse a rollout no honest sampler sends (`bad_rollout`, an error event); what its
        sender held goes back to the ledger, and it is counted against the sender."""
        self.admit(peer, kind, ("bad_rollout", why))
        self.strike(peer.instance, why)

    def strike(self, instance: str, why: str) -> None:
        """Count one impossible rollout against the generator `instance`; quarantine it at
        `security.verify.max_bad_rollouts`."""
        self.bad_rollouts[instance] += 1
        limit = self.cfg.security.verify.max_bad_rollouts
        if self.bad_rollouts[instance] >= limit and self.verifier.quarantine(instance):
            self._quarantine(instance, reason=why, bad_rollouts=self.bad_rollouts[instance])

    def accepted(self, group_id: int, peer: Peer) -> None:
        """`peer`'s Rollout of `group_id` was taken: its evidence will be about `peer`."""
        self.verifier.produced_by(group_id, peer.instance)

    def evidence(self, msg: m.RolloutEvidence) -> None:
        """A trainer rank's per-group log-prob gaps: who generated those groups is judged."""
        for verdict in self.verifier.evidence(msg):
            gap = round(verdict.median_excess, 4)
            bound = self.cfg.security.verify.max_gap
            self._quarantine(
                verdict.instance, median_excess_gap=gap, max_gap=bound, window=verdict.groups
            )

    def _quarantine(self, name: str, **why: object) -> None:
        """No more work for `name`; its leases back to the ledger; the groups it generated
        that are not trained yet generated again by others."""
        held = self.ledger.release_holder(name)
        mine = {gid for gid, who in self.verifier.produced.items() if who == name}
        self.buffer.drop(mine)
        regenerated = [gid for gid in sorted(mine) if self.ledger.regenerate(gid)]
        for gid in regenerated:
            self.rollouts.pop(gid, None)
        again = len(regenerated)
        log.error("generator.quarantined", instance=name, requeued=held, regenerated=again, **why)
