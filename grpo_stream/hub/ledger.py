"""The hub's ledger: where every prompt (group) is, who holds it, and the staleness gate.

Invariant (checked by `check_invariant` and the tests): every dispatched group ends exactly
once as trained, filtered, stale, failed or discarded (trained in steps the trainer later
discarded by resuming from an older checkpoint); until then it is in exactly one of the stages
queued (waiting for a generator, e.g. after its holder was lost), generating, to_score,
scoring, to_teach, teaching (distillation: waiting for, or held by, a teacher), or buffered.
So at any moment

    dispatched == trained + filtered + stale + failed + in_progress

A Rollout or Scored for a group that is no longer at that stage (a duplicate from a holder
declared lost that came back, or a re-dispatched copy that lost the race) is dropped and
counted, so nothing reaches the trainer twice.

Versions and staleness have this one owner. The trainer's version is written only by
`observe_trainer` (what its batch requests name) and `step_served` (the version it will name
next, once a step went out); "stale" has one formula, `staleness` / `is_stale`, which the
replay buffer, the batch desk, the rollout gate and the step statistics ask, and a rollout
counts from its `policy_version`, which is its oldest token's version (hub.guard refuses a
rollout where it is not); the highest version a trainer can plausibly name is
`plausible_trainer_version`.

The staleness gate (`capacity`, `min_version`) is `grpo_stream.hub.gate`'s arithmetic on the
ledger's pipeline. The leases (who holds which groups, and who was issued what) are
`grpo_stream.hub.leases`'s, kept in `Ledger.leases`.

Dynamic sampling with refill (`drop_zero_signal`, `grpo_stream.hub.refill`): a group without
signal is filtered and its slot refilled (it leaves the pipeline, so the gate lets a new
prompt out in its place) or, past the step's refills, left as a hole that holds its slot
until the next step, served short by it, goes out. So also `refilled <= filtered`.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal

from grpo_stream.hub.gate import Pipeline
from grpo_stream.hub.leases import Kind, Lease, LeaseBook
from grpo_stream.hub.refill import Refill

Stage = Literal["queued", "generating", "to_score", "scoring", "to_teach", "teaching", "buffered"]
Outcome = Literal["trained", "filtered", "stale", "failed", "discarded"]
TERMINAL = ("trained", "filtered", "stale", "failed", "discarded")


@dataclass
class Ledger:
    """Stage of every live group, leases, and the accounting counters."""

    groups_per_step: int
    max_staleness: int
    lease_timeout_s: float
    max_refill_ratio: float = 2.0
    refill_ahead: bool = False  # plan replacements before the losses are known (hub setting)
    teach_timeout_s: float | None = None  # a teacher's lease deadline (None: lease_timeout_s)
    cursor: int = 0  # next dataset index: group ids are dataset indices
    next_version: int = 0  # trainer version at its next batch request (written below only)
    trainer_version: int = 0  # the version the trainer last named (in Welcome and Status)
    stage: dict[int, Stage] = field(default_factory=dict)
    leases: LeaseBook = field(default_factory=LeaseBook)
    retry: deque[int] = field(default_factory=deque)  # groups to (re)generate, oldest first
    to_score: deque[int] = field(default_factory=deque)
    to_teach: deque[int] = field(default_factory=deque)
    counters: Counter[str] = field(default_factory=Counter)
    refill: Refill = field(init=False)  # slots, refills and holes of dynamic sampling

    def __post_init__(self) -> None:
        self.refill = Refill(self.groups_per_step, self.max_refill_ratio)

    # ----- versions and staleness: the one owner ----------------------------------------
    def observe_trainer(self, version: int) -> None:
        """The trainer's version, as its batch request names it (versions are unique: a
        resumed trainer publishes above every version it announced before)."""
        self.trainer_version = version
        self.next_version = version

    def step_served(self, version: int, groups: int | None = None) -> None:
        """A step for the trainer at `version` went out (with `groups` groups; None: a full
        step): it asks next at version + 1; the step's holes are spent, refills renewed."""
        self.next_version = version + 1
        self.refill.served(self.groups_per_step if groups is None else groups)

    def staleness(self, version: int) -> int:
        """How many policy versions `version` is behind the trainer; never negative (a version
        the hub has not yet heard the trainer name is not behind it)."""
        return max(0, self.next_version - version)

    def is_stale(self, version: int) -> bool:
        """True if what `version` generated is too old to train at the trainer's version."""
        return self.staleness(version) > self.max_staleness

    def plausible_trainer_version(self) -> int:
        """The highest version a batch request can name: a trainer resumed from an older
        checkpoint continues `max_staleness + 1` above what it announced
        (`grpo_stream.training.versions.resumed_version`)."""
        return self.next_version + self.max_staleness + 1

    # ----- dispatch -------------------------------------------------------------------
    def in_pipeline(self) -> int:
        """Groups that will still reach the trainer for the first time."""
        return len(self.stage)

    def _pipeline(self) -> Pipeline:
        """The pipeline as the staleness gate counts it (with refill_ahead, unscored groups
        take a slot at the signal rate: `Refill.per_slot`)."""
        buffered = sum(1 for stage in self.stage.values() if stage == "buffered")
        per_slot = self.refill.per_slot() if self.refill_ahead else 1.0
        return Pipeline(
            self.groups_per_step, self.max_staleness, self.next_version, self.refill.holes,
            buffered, self.in_pipeline() - buffered, per_slot,
        )  # fmt: skip

    def capacity(self) -> int:
        """How many more groups the staleness gate lets out now (`Pipeline.capacity`)."""
        return self._pipeline().capacity()

    def min_version(self, count: int) -> int:
        """Policy version a batch of `count` new prompts must be generated with, at least
        (`Pipeline.min_version`)."""
        return self._pipeline().min_version(count)

    def drop_zero_signal(self, group_id: int) -> bool:
        """A scored group without signal is filtered; True if its slot is refilled (a new
        prompt takes it), False if it stays a hole of the next step (refills used up)."""
        self.finish(group_id, "filtered")
        refilled, emptied = self.refill.drop()
        self.counters["refilled"] += refilled
        self.counters["empty_steps"] += emptied  # a whole step came back without signal
        return refilled

    def take_for_generation(self, holder: str, want: int, now: float) -> tuple[Lease, int] | None:
        """Lease up to `want` groups (retries first, then new dataset indices). New prompts
        are leased up to the first that needs a newer version than the first one does, so a
        generator never holds prompts it could sample now behind ones that wait for weights
        (the rest go in its next lease)."""
        count = min(want, len(self.retry) + self.capacity())
        if count <= 0:
            return None
        if not self.retry:
            count = self._pipeline().same_version(count)
        min_version = self.min_version(count) if not self.retry else self.next_version
        ids: list[int] = []
        while self.retry and len(ids) < count:
            ids.append(self.retry.popleft())
            self.counters["redispatched"] += 1
        while len(ids) < count:
            ids.append(self.cursor)
            self.cursor += 1
            self.counters["dispatched"] += 1
        lease = self._lease(holder, "generate", ids, now)
        for gid in ids:
            self.stage[gid] = "generating"
        return lease, min(min_version, self.next_version)

    def take_for_scoring(self, holder: str, now: float) -> tuple[Lease, int] | None:
        if not self.to_score:
            return None
        gid = self.to_score.popleft()
        lease = self._lease(holder, "score", [gid], now)
        self.stage[gid] = "scoring"
        return lease, gid

    def take_for_teaching(self, holder: str, now: float) -> tuple[Lease, int] | None:
        """Lease the oldest group waiting for a teacher (deadline: teach_timeout_s)."""
        if not self.to_teach:
            return None
        gid = self.to_teach.popleft()
        lease = self._lease(holder, "teach", [gid], now)
        self.stage[gid] = "teaching"
        return lease, gid

    def _lease(self, holder: str, kind: Kind, ids: list[int], now: float) -> Lease:
        timeout = self.lease_timeout_s
        if kind == "teach" and self.teach_timeout_s is not None:
            timeout = self.teach_timeout_s
        return self.leases.issue(holder, kind, ids, now + timeout)

    # ----- results --------------------------------------------------------------------
    def accept_rollout(self, group_id: int) -> bool:
        """A group's completions arrived; False (counted) if it is not awaiting them."""
        if self.stage.get(group_id) not in ("generating", "queued"):
            self.counters["duplicates_dropped"] += 1
            return False
        if self.stage[group_id] == "queued":
            self.retry.remove(group_id)  # its holder came back: keep its work
        self.leases.release(group_id)
        self.stage[group_id] = "to_score"
        self.to_score.append(group_id)
        return True

    def accept_scored(self, group_id: int) -> bool:
        if self.stage.get(group_id) not in ("scoring", "to_score"):
            self.counters["duplicates_dropped"] += 1
            return False
        if self.stage[group_id] == "to_score":
            self.to_score.remove(group_id)
        self.leases.release(group_id)
        self.stage[group_id] = "buffered"
        return True

    def await_teacher(self, group_id: int) -> None:
        """A scored group (buffered in the ledger, held by the hub) goes to a teacher first."""
        if self.stage.get(group_id) != "buffered":
            raise ValueError(f"group {group_id} is {self.stage.get(group_id)}, not scored")
        self.stage[group_id] = "to_teach"
        self.to_teach.append(group_id)

    def accept_taught(self, group_id: int) -> bool:
        """A teacher's log-probs arrived; False (counted) if the group is not awaiting them."""
        if self.stage.get(group_id) not in ("teaching", "to_teach"):
            self.counters["duplicates_dropped"] += 1
            return False
        if self.stage[group_id] == "to_teach":
            self.to_teach.remove(group_id)
        self.leases.release(group_id)
        self.stage[group_id] = "buffered"
        return True

    def finish(self, group_id: int, outcome: Outcome) -> None:
        """A group leaves the pipeline for good."""
        if group_id in self.to_score:
            self.to_score.remove(group_id)
        if group_id in self.to_teach:
            self.to_teach.remove(group_id)
        if group_id in self.retry:
            self.retry.remove(group_id)
        self.leases.release(group_id)
        del self.stage[group_id]
        self.counters[outcome] += 1

    def retract_trained(self, n: int) -> None:
        """`n` groups counted trained were in a batch the trainer could not train (it died
        on it, `security.batch_crash_limit` times): they end failed instead."""
        self.counters["trained"] -= n
        self.counters["failed"] += n

    def discard_trained(self, n: int) -> None:
        """`n` trained groups belonged to steps the trainer discarded (it went back to an
        older checkpoint): they end as discarded instead (see `grpo_stream.hub.serving`)."""
        self.counters["trained"] -= n
        self.counters["discarded"] += n

    def replay_trained(self, group_ids: list[int]) -> None:
        """Groups sent to the trainer after the restored checkpoint was written (from the
        send journal): they are trained. Dataset indices the checkpoint had not reached were
        dispatched before the crash: the ones not sent are generated again."""
        for gid in group_ids:
            while self.cursor <= gid:
                self.stage[self.cursor] = "queued"
                self.retry.append(self.cursor)
                self.counters["dispatched"] += 1
                self.cursor += 1
            if gid in self.stage:
                self.finish(gid, "trained")

    # ----- direct payloads: the generator's copy is gone -------------------------------
    def regenerate(self, group_id: int) -> bool:
        """A group returned but not yet trained whose payload was lost with its generator
        (hub.payloads = "direct"): generate it again. False if it is at no such stage."""
        if self.stage.get(group_id) not in ("to_score", "scoring", "buffered"):
            return False
        if group_id in self.to_score:
            self.to_score.remove(group_id)
        self.leases.release(group_id)
        self.stage[group_id] = "queued"
        self.retry.append(group_id)
        self.counters["requeued_payload"] += 1
        return True

    def unserve(self, group_ids: list[int]) -> None:
        """Groups counted trained at their first use in a step the trainer could not build
        (a payload was lost): not trained after all; generate them again."""
        for gid in group_ids:
            self.counters["trained"] -= 1
            self.stage[gid] = "queued"
            self.retry.append(gid)
            self.counters["requeued_payload"] += 1

    # ----- loss of a holder -----------------------------------------------------------
    def release_holder(self, holder: str) -> int:
        """Put back everything `holder` held; returns how many groups."""
        return sum(self._requeue(lease) for lease in self.leases.of_holder(holder))

    def expire(self, now: float) -> int:
        """Re-dispatch leases past their deadline."""
        return sum(self._requeue(lease) for lease in self.leases.past(now))

    def _requeue(self, lease: Lease) -> int:
        groups = self.leases.take_back(lease)
        for gid in groups:
            if lease.kind == "generate":
                self.stage[gid] = "queued"
                self.retry.append(gid)
            elif lease.kind == "teach":
                self.stage[gid] = "to_teach"
                self.to_teach.appendleft(gid)
            else:
                self.stage[gid] = "to_score"
                self.to_score.appendleft(gid)
            self.counters[f"requeued_{lease.kind}"] += 1
        return len(groups)

    # ----- accounting -----------------------------------------------------------------
    def check_invariant(self) -> None:
        """Raise AssertionError if a group was lost or counted twice."""
        done = sum(self.counters[k] for k in TERMINAL)
        if self.counters["dispatched"] != done + self.in_pipeline():
            raise AssertionError(
                f"accounting: dispatched={self.counters['dispatched']} != "
                f"terminal={done} + in_progress={self.in_pipeline()}"
            )
        if self.counters["refilled"] > self.counters["filtered"]:
            raise AssertionError(
                f"accounting: refilled={self.counters['refilled']} > "
                f"filtered={self.counters['filtered']}"
            )
        self.refill.check()

    def summary(self) -> dict[str, int]:
        out = {k: int(self.counters[k]) for k in ("dispatched", *TERMINAL)}
        out.update(
            in_progress=self.in_pipeline(),
            redispatched=int(self.counters["redispatched"]),
            requeued_generate=int(self.counters["requeued_generate"]),
            requeued_score=int(self.counters["requeued_score"]),
            requeued_payload=int(self.counters["requeued_payload"]),
            requeued_teach=int(self.counters["requeued_teach"]),
            duplicates_dropped=int(self.counters["duplicates_dropped"]),
            refilled=int(self.counters["refilled"]),
            empty_steps=int(self.counters["empty_steps"]),
        )
        return out

    # ----- checkpoint -----------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Msgpack-native state; leases are not kept: their groups are re-queued on restore
        (a late result from the old holder is still accepted once). Groups waiting for a
        teacher are generated again (the hub does not keep them across a restart)."""
        return {
            "cursor": self.cursor,
            "next_version": self.next_version,
            "trainer_version": self.trainer_version,
            "stage": {str(k): v for k, v in self.stage.items()},
            "retry": list(self.retry),
            "to_score": list(self.to_score),
            "counters": dict(self.counters),
            "next_lease": self.leases.next_lease,
            **self.refill.state(),
        }

    def load_state(self, state: dict[str, Any], scored: set[int]) -> None:
        """Restore; groups that were leased go back to their queue. `scored`: groups whose
        rollout the hub still holds (awaiting a score)."""
        self.cursor = int(state["cursor"])
        self.next_version = int(state["next_version"])
        self.trainer_version = int(state["trainer_version"])
        self.counters = Counter({k: int(v) for k, v in state["counters"].items()})
        self.leases.restart(int(state["next_lease"]))
        if "holes" in state:  # checkpoints from before refill have none of its state
            self.refill.load_state(state)
        self.retry = deque(int(g) for g in state["retry"])
        # only groups whose rollout survived can be scored: the others are generated again
        self.to_score = deque(int(g) for g in state["to_score"] if int(g) in scored)
        self.to_teach = deque()
        self.stage = {}
        for key, stage in state["stage"].items():
            gid = int(key)
            again = stage in ("generating", "to_teach", "teaching")
            if again or (stage in ("to_score", "scoring") and gid not in scored):
                self.stage[gid] = "queued"
                if gid not in self.retry:
                    self.retry.append(gid)
            elif stage in ("to_score", "scoring"):
                self.stage[gid] = "to_score"
                if gid not in self.to_score:
                    self.to_score.append(gid)
            else:
                self.stage[gid] = stage
