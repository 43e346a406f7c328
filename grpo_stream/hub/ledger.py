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

Versions and staleness have one owner, `Ledger.versions` (grpo_stream.hub.versions); the
counters and the check of the invariant over them are `grpo_stream.hub.accounts`'s, kept in
`Ledger.counters`; what of the ledger survives a restart is `grpo_stream.hub.ledger_state`'s.

The staleness gate is `grpo_stream.hub.gate`'s arithmetic on the ledger's `pipeline()`. The
leases (who holds which groups, and who was issued what) are `grpo_stream.hub.leases`'s, kept
in `Ledger.leases`.

New group ids come from the ledger's prompt source (`grpo_stream.hub.curriculum`): every
dataset index in order, or with hub.curriculum the ones its pass rates let out (the others are
passed over, counted as skipped; `cursor` is the next index the source considers).

Dynamic sampling with refill (`drop_zero_signal`, `grpo_stream.hub.refill`): a group without
signal is filtered and its slot refilled (it leaves the pipeline, so the gate lets a new
prompt out in its place) or, past the step's refills, left as a hole that holds its slot
until the next step, served short by it, goes out. So also `refilled <= filtered`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from grpo_stream.hub.accounts import Accounts
from grpo_stream.hub.curriculum import PromptSource, Stream
from grpo_stream.hub.gate import Pipeline
from grpo_stream.hub.leases import Kind, Lease, LeaseBook
from grpo_stream.hub.refill import Refill
from grpo_stream.hub.versions import PolicyVersions

Stage = Literal["queued", "generating", "to_score", "scoring", "to_teach", "teaching", "buffered"]
Outcome = Literal["trained", "filtered", "stale", "failed", "discarded"]


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
    stage: dict[int, Stage] = field(default_factory=dict)
    leases: LeaseBook = field(default_factory=LeaseBook)
    retry: deque[int] = field(default_factory=deque)  # groups to (re)generate, oldest first
    to_score: deque[int] = field(default_factory=deque)
    to_teach: deque[int] = field(default_factory=deque)
    counters: Accounts = field(default_factory=Accounts)
    refill: Refill = field(init=False)  # slots, refills and holes of dynamic sampling
    versions: PolicyVersions = field(init=False)  # the trainer's version, staleness
    source: PromptSource = field(default_factory=Stream)  # new indices: in order, or curriculum

    def __post_init__(self) -> None:
        self.refill = Refill(self.groups_per_step, self.max_refill_ratio)
        self.versions = PolicyVersions(self.max_staleness)

    def step_served(self, version: int, groups: int | None = None) -> None:
        """A step for the trainer at `version` went out (with `groups` groups; None: a full
        step): it asks next at version + 1; the step's holes are spent, refills renewed."""
        self.versions.served(version)
        self.refill.served(self.groups_per_step if groups is None else groups)

    # ----- dispatch -------------------------------------------------------------------
    def in_pipeline(self) -> int:
        """Groups that will still reach the trainer for the first time."""
        return len(self.stage)

    def pipeline(self) -> Pipeline:
        """The pipeline as the staleness gate counts it (with refill_ahead, unscored groups
        take a slot at the signal rate: `Refill.per_slot`)."""
        buffered = sum(1 for stage in self.stage.values() if stage == "buffered")
        return Pipeline(
            groups_per_step=self.groups_per_step,
            max_staleness=self.max_staleness,
            next_version=self.versions.next_version,
            holes=self.refill.holes,
            buffered=buffered,
            unscored=self.in_pipeline() - buffered,
            per_slot=self.refill.per_slot() if self.refill_ahead else 1.0,
        )

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
        gate = self.pipeline()
        next_version = self.versions.next_version
        count = min(want, len(self.retry) + gate.capacity())
        if count <= 0:
            return None
        if not self.retry:
            count = gate.same_version(count)
        min_version = gate.min_version(count) if not self.retry else next_version
        ids: list[int] = []
        while self.retry and len(ids) < count:
            ids.append(self.retry.popleft())
            self.counters["redispatched"] += 1
        while len(ids) < count:
            gid = self.source.next_index(self.cursor)  # the prompt source may pass some over
            self.counters["skipped"] += gid - self.cursor
            ids.append(gid)
            self.cursor = gid + 1
            self.counters["dispatched"] += 1
        lease = self._lease(holder, "generate", ids, now)
        for gid in ids:
            self.stage[gid] = "generating"
        return lease, min(min_version, next_version)

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
        """Raise AssertionError if a group was lost or counted twice (module docstring)."""
        self.counters.check(self.in_pipeline())
        self.refill.check()

    def summary(self) -> dict[str, int]:
        return self.counters.summary(self.in_pipeline())
