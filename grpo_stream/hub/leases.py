"""The hub's leases: which service instance holds which groups, until when, and who was ever
issued what.

A group is under at most one open lease (`holding`); a lease closes when its last group is
released or the whole lease is taken back (its holder lost, or past its deadline). Closed
leases are remembered (the last `ISSUED_KEPT`), so a late result naming one is told from a
stranger's (`issued_to`). The stages the groups go to are the ledger's
(`grpo_stream.hub.ledger`); this module only keeps the leases.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

ISSUED_KEPT = 65536
"""Leases remembered after they closed, so a late result is told from a stranger's."""

Kind = Literal["generate", "score", "teach"]


@dataclass
class Lease:
    """Work handed to one service instance, re-dispatched if the holder is lost or late."""

    lease_id: int
    holder: str
    kind: Kind
    group_ids: set[int]
    deadline: float


@dataclass
class LeaseBook:
    """Open leases, the lease of every leased group, and the record of issued leases."""

    open: dict[int, Lease] = field(default_factory=dict)
    lease_of: dict[int, int] = field(default_factory=dict)  # group -> lease id
    next_lease: int = 1
    _held: Counter[str] = field(default_factory=Counter)  # groups being generated, per holder
    # lease id -> (holder, kind, groups) of the last ISSUED_KEPT leases, closed ones included
    _issued: dict[int, tuple[str, str, frozenset[int]]] = field(default_factory=dict)
    _issued_floor: int = 1  # leases below this were issued before a restart: not remembered

    def issue(self, holder: str, kind: Kind, ids: list[int], deadline: float) -> Lease:
        lease = Lease(self.next_lease, holder, kind, set(ids), deadline)
        self.next_lease += 1
        self.open[lease.lease_id] = lease
        self._issued[lease.lease_id] = (holder, kind, frozenset(ids))
        if len(self._issued) > ISSUED_KEPT:
            del self._issued[next(iter(self._issued))]
        for gid in ids:
            self.lease_of[gid] = lease.lease_id
        if kind == "generate":
            self._held[holder] += len(ids)
        return lease

    def holding(self, group_id: int) -> Lease | None:
        """The open lease on `group_id`, if any."""
        return self.open.get(self.lease_of.get(group_id, -1))

    def held_by(self) -> Counter[str]:
        """Groups being generated, per holder (kept as leases change: dispatch asks at every
        tick; read it, do not change it)."""
        return self._held

    def _unhold(self, lease: Lease, n: int) -> None:
        if lease.kind == "generate":
            self._held[lease.holder] -= n
            if self._held[lease.holder] <= 0:
                del self._held[lease.holder]

    def issued_to(self, lease_id: int, group_id: int, holder: str, kind: str) -> str | None:
        """None if lease `lease_id` of `kind` was issued to `holder` and covered `group_id`
        (open, or closed: a late result is the ledger's to drop as a duplicate); else why a
        result naming it cannot be `holder`'s. A lease from before a hub restart is not
        remembered: such a result goes on to the stage checks."""
        issued = self._issued.get(lease_id)
        if issued is None:
            if lease_id < self._issued_floor:
                return None
            return f"lease {lease_id} was never issued"
        owner, what, groups = issued
        if (owner, what) != (holder, kind) or group_id not in groups:
            return f"lease {lease_id} is not {holder}'s {kind} lease on group {group_id}"
        return None

    def release(self, group_id: int) -> None:
        """`group_id` leaves its lease (if any); a lease left without groups closes."""
        lease_id = self.lease_of.pop(group_id, None)
        if lease_id is None:
            return
        lease = self.open.get(lease_id)
        if lease is not None:
            if group_id in lease.group_ids:
                lease.group_ids.discard(group_id)
                self._unhold(lease, 1)
            if not lease.group_ids:
                del self.open[lease_id]

    def of_holder(self, holder: str) -> list[Lease]:
        return [lease for lease in self.open.values() if lease.holder == holder]

    def past(self, now: float) -> list[Lease]:
        """Open leases past their deadline."""
        return [lease for lease in self.open.values() if lease.deadline < now]

    def take_back(self, lease: Lease) -> list[int]:
        """Close `lease` before its groups came back; returns them, sorted."""
        del self.open[lease.lease_id]
        self._unhold(lease, len(lease.group_ids))
        for gid in lease.group_ids:
            self.lease_of.pop(gid, None)
        return sorted(lease.group_ids)

    def restart(self, next_lease: int) -> None:
        """After a restore: no lease is open; ids continue at `next_lease`, and the ones below
        it are not remembered (they were issued before the restart)."""
        self.next_lease = next_lease
        self._issued_floor = next_lease
        self._issued.clear()
        self.open.clear()
        self.lease_of.clear()
        self._held.clear()
