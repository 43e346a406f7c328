"""The hub's side of direct payloads (`hub.payloads = "direct"`): where each live group's
payload is, the ScoreRefs that point scorers at it, and what a lost payload costs.

The hub holds a shell of each returned group (lengths, no tokens: `payload_refs.shell_rollout`)
and, here, the generator whose store has it, the store's address and the digest. The ledger,
the staleness gate, the leases, the replay buffer and the journal (ids and digests now) keep
the accounting they keep for payloads that travel through the hub.

Invariant (exactly-once, as `grpo_stream.hub.ledger` states it): a group whose payload is lost
before it is trained is generated again, once, through the ledger's retry queue:
- its generator is lost (silent past the heartbeat deadline, left, or restarted under the
  same instance with a new pid): every group it holds at to_score, scoring or buffered
  (never used) goes back to generation; groups already trained and buffered for reuse only
  leave the buffer;
- a scorer holding the score lease says it could not fetch it (`PayloadLost`): that group;
- the trainer says it could not build the step just served (`PayloadLost` naming that
  step, version and attempt): the step is un-served and all of its first uses are generated
  again (the hub then checkpoints, so a restart cannot count them trained from the journal).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.payloads.refs import check_meta, shell_rollout
from grpo_stream.hub.registry import Peer
from grpo_stream.hub.replay import Group
from grpo_stream.hub.serving import BatchDesk
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.payloads import PayloadLost, RolloutMeta, ScoreRef
from grpo_stream.tasks.base import Task

Refuse = Callable[[bytes, str, str, str], None]
"""The hub's refusal: (identity, code, reason, kind)."""

log = structlog.get_logger()


class DirectPayloads:
    """Where the hub's live groups' payloads are, and the reactions to losing them."""

    def __init__(
        self,
        group_size: int,
        task: Task,
        ledger: Ledger,
        desk: BatchDesk,
        rollouts: dict[int, m.Rollout],
        refuse: Refuse,
        checkpoint: Callable[[], None],
    ) -> None:
        self.group_size = group_size
        self.ledger = ledger
        self.desk = desk
        self.buffer = desk.buffer
        self.rollouts = rollouts  # the hub's shells awaiting a score (shared with it)
        self.task = task  # the hub's: prompts as the generators got them
        self.refuse = refuse  # the hub's: counted, answered with an Error, logged
        self.checkpoint = checkpoint
        self.where: dict[int, tuple[str, str, str]] = {}  # gid -> (holder, source, digest)

    def on_meta(self, peer: Peer, msg: RolloutMeta) -> None:
        """A group's completions wait in its generator's store: the ledger takes it as it
        takes a Rollout; the hub keeps a shell (lengths) and where the payload is."""
        refused = check_meta(msg, self.group_size)
        if refused is not None:
            self.refuse(peer.identity, "bad_rollout", refused, msg.KIND)
            return
        if not self.ledger.accept_rollout(msg.group_id):
            return
        if self.ledger.versions.is_stale(msg.policy_version):
            self.ledger.finish(msg.group_id, "stale")
            return
        self.rollouts[msg.group_id] = shell_rollout(msg)
        self.where[msg.group_id] = (peer.instance, msg.source, msg.digest)

    def score_request(self, lease_id: int, group_id: int) -> ScoreRef:
        """A scorer's request for a group: the task's prompt and reference (the hub's own,
        not the generator's), the payload's address and digest."""
        problem = self.task.problem(group_id)
        _, source, digest = self.where[group_id]
        return ScoreRef(
            lease_id=lease_id,
            group_id=group_id,
            prompt=problem.prompt,
            reference=dict(problem.reference),
            source=source,
            digest=digest,
        )

    def attach(self, group: Group) -> None:
        """A scored group keeps its payload's address and digest into the buffer."""
        _, group.source, group.digest = self.where[group.group_id]

    # ----- losses -----------------------------------------------------------------------
    def holder_lost(self, holder: str, why: str) -> int:
        """Every group whose payload only `holder` had and that is not trained yet goes
        back to generation; returns how many."""
        gids = {gid for gid, (h, _, _) in self.where.items() if h == holder}
        if not gids:
            return 0
        dropped = {g.group_id for g in self.buffer.drop(gids)}
        n = 0
        for gid in sorted(gids):
            if self.ledger.regenerate(gid):  # False: trained already (dropped from reuse)
                n += 1
            self.rollouts.pop(gid, None)
            del self.where[gid]
        log.warning(
            "payloads.holder_lost",
            holder=holder,
            why=why,
            regenerated=n,
            buffered_dropped=len(dropped),
        )
        return n

    def on_lost(self, peer: Peer, msg: PayloadLost) -> None:
        """A scorer's or the trainer's `PayloadLost`; one that names nothing its sender
        could have been sent is refused (code bad_payload_lost)."""

        def refuse(why: str) -> None:
            self.refuse(peer.identity, "bad_payload_lost", why, msg.KIND)

        if peer.service == "scorer":
            self._scorer_lost(peer, msg, refuse)
        elif peer.service == "trainer":
            first = self.desk.unserve(msg.step, msg.trainer_version, msg.attempt)
            if first is None:
                refuse(
                    f"step {msg.step} (v{msg.trainer_version}, attempt {msg.attempt}) "
                    "is not the step last served"
                )
                return
            self.ledger.unserve(first)
            self.checkpoint()
            log.warning(
                "payloads.step_unserved",
                step=msg.step,
                groups=first,
                lost=list(msg.group_ids),
                codes=list(msg.codes),
                reason=msg.reason,
            )
        else:
            refuse(f"payload_lost comes from a scorer or the trainer, not a {peer.service}")

    def _scorer_lost(self, peer: Peer, msg: PayloadLost, refuse: Callable[[str], None]) -> None:
        for gid in msg.group_ids:
            lease = self.ledger.leases.holding(gid)
            if lease is None or lease.kind != "score" or lease.holder != peer.instance:
                refuse(f"group {gid}: {peer.instance} holds no score lease on it")
                continue
            if self.ledger.regenerate(gid):
                self.rollouts.pop(gid, None)
                self.where.pop(gid, None)
                emit = log.error if "refused" in msg.codes else log.warning
                emit("payloads.score_fetch_lost", group_id=gid, reason=msg.reason)

    def prune(self) -> None:
        """Forget groups that left the pipeline and the buffer (trained, stale, ...)."""
        live = set(self.ledger.stage) | {g.group_id for g in self.buffer.groups()}
        self.where = {gid: w for gid, w in self.where.items() if gid in live}
