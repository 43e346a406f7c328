"""The ledger's counters and the exactly-once check over them (grpo_stream.hub.ledger).

Every dispatched group ends exactly once in one of TERMINAL or is still in the pipeline:

    dispatched == trained + filtered + stale + failed + discarded + in_progress

and a filtered group's slot is refilled at most once (`refilled <= filtered`).
"""

from __future__ import annotations

from collections import Counter

TERMINAL = ("trained", "filtered", "stale", "failed", "discarded")
REPORTED = (
    "redispatched",
    "requeued_generate",
    "requeued_score",
    "requeued_payload",
    "requeued_teach",
    "duplicates_dropped",
    "refilled",
    "empty_steps",
    "skipped",
)
"""Counters `summary` reports besides `dispatched`, TERMINAL and in_progress."""


class Accounts(Counter[str]):
    """Counts by name: dispatched, each end of TERMINAL, re-dispatches, drops, refills."""

    def retract_trained(self, n: int) -> None:
        """`n` groups counted trained were in a batch the trainer could not train (it died
        on it, `security.batch_crash_limit` times): they end failed instead."""
        self["trained"] -= n
        self["failed"] += n

    def discard_trained(self, n: int) -> None:
        """`n` trained groups belonged to steps the trainer discarded (it went back to an
        older checkpoint): they end as discarded instead (see `grpo_stream.hub.serving`)."""
        self["trained"] -= n
        self["discarded"] += n

    def check(self, in_progress: int) -> None:
        """Raise AssertionError if a group was lost or counted twice."""
        done = sum(self[k] for k in TERMINAL)
        if self["dispatched"] != done + in_progress:
            raise AssertionError(
                f"accounting: dispatched={self['dispatched']} != "
                f"terminal={done} + in_progress={in_progress}"
            )
        if self["refilled"] > self["filtered"]:
            raise AssertionError(
                f"accounting: refilled={self['refilled']} > filtered={self['filtered']}"
            )

    def summary(self, in_progress: int) -> dict[str, int]:
        out = {k: int(self[k]) for k in ("dispatched", *TERMINAL)}
        out["in_progress"] = in_progress
        out.update({k: int(self[k]) for k in REPORTED})
        return out
