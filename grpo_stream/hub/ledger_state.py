"""The ledger in the hub's checkpoint: what survives a restart of the hub, and the send
journal replayed over it.

Msgpack-native state. Leases are not kept: their groups are re-queued on restore (a late
result from the old holder is still accepted once). Groups waiting for a teacher are
generated again (the hub does not keep them across a restart), and so are groups awaiting a
score whose rollout the hub no longer holds. The accounting counters are kept as they were,
so the exactly-once invariant (grpo_stream.hub.ledger) holds across the restart.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from grpo_stream.hub.accounts import Accounts
from grpo_stream.hub.ledger import Ledger, Stage

REGENERATED = ("generating", "to_teach", "teaching")
"""Stages whose groups are generated again after a restart."""


def ledger_state(ledger: Ledger) -> dict[str, Any]:
    """The ledger as the hub's checkpoint keeps it."""
    return {
        "cursor": ledger.cursor,
        "next_version": ledger.versions.next_version,
        "trainer_version": ledger.versions.trainer_version,
        "stage": {str(k): v for k, v in ledger.stage.items()},
        "retry": list(ledger.retry),
        "to_score": list(ledger.to_score),
        "counters": dict(ledger.counters),
        "next_lease": ledger.leases.next_lease,
        "source": ledger.source.state(),  # the curriculum's pass rates (hub.curriculum)
        **ledger.refill.state(),
    }


def load_ledger(ledger: Ledger, state: dict[str, Any], scored: set[int]) -> None:
    """Restore `ledger`; groups that were leased go back to their queue. `scored`: groups
    whose rollout the hub still holds (awaiting a score)."""
    ledger.cursor = int(state["cursor"])
    ledger.versions.next_version = int(state["next_version"])
    ledger.versions.trainer_version = int(state["trainer_version"])
    ledger.counters = Accounts({k: int(v) for k, v in state["counters"].items()})
    ledger.leases.restart(int(state["next_lease"]))
    if "holes" in state:  # checkpoints from before refill have none of its state
        ledger.refill.load_state(state)
    if "source" in state:  # nor those from before the curriculum of it
        ledger.source.load_state(state["source"])
    ledger.retry = deque(int(g) for g in state["retry"])
    # only groups whose rollout survived can be scored: the others are generated again
    ledger.to_score = deque(int(g) for g in state["to_score"] if int(g) in scored)
    ledger.to_teach = deque()
    ledger.stage = {}
    for key, stage in state["stage"].items():
        _restore(ledger, int(key), stage, scored)


def _restore(ledger: Ledger, gid: int, stage: Stage, scored: set[int]) -> None:
    if stage in REGENERATED or (stage in ("to_score", "scoring") and gid not in scored):
        ledger.stage[gid] = "queued"
        if gid not in ledger.retry:
            ledger.retry.append(gid)
    elif stage in ("to_score", "scoring"):
        ledger.stage[gid] = "to_score"
        if gid not in ledger.to_score:
            ledger.to_score.append(gid)
    else:
        ledger.stage[gid] = stage


def replay_trained(ledger: Ledger, group_ids: list[int]) -> None:
    """Groups sent to the trainer after the restored checkpoint was written (from the send
    journal, grpo_stream.hub.journal): they are trained. Dataset indices the checkpoint had
    not reached were dispatched before the crash: the ones not sent are generated again."""
    for gid in group_ids:
        while ledger.cursor <= gid:
            ledger.stage[ledger.cursor] = "queued"
            ledger.retry.append(ledger.cursor)
            ledger.counters["dispatched"] += 1
            ledger.cursor += 1
        if gid in ledger.stage:
            ledger.finish(gid, "trained")
