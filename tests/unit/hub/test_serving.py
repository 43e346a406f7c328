"""The batch desk: a step is served when all its ranks asked and its groups are fresh; each
rank gets its shard; first uses are counted trained once; a lost rank's request is dropped."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from grpo_stream.config import HubSettings
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.replay import Group, ReplayBuffer
from grpo_stream.hub.serving import BatchDesk
from grpo_stream.protocols import messages as m

sys.path.insert(0, str(Path(__file__).parent))
from test_replay import group

GPS = 4


class Desk:
    """A desk over a real ledger and buffer; `sent` records what went to whom."""

    def __init__(self, staleness: int = 1) -> None:
        self.hub = HubSettings(groups_per_step=GPS, max_staleness=staleness)
        self.ledger = Ledger(GPS, staleness, lease_timeout_s=10.0)
        self.buffer = ReplayBuffer(capacity=64)
        self.sent: list[tuple[bytes, m.Message]] = []
        self.stats_calls = 0
        self.desk = BatchDesk(self.hub, self.ledger, self.buffer, self._send, self._stats)

    def _send(self, identity: bytes, msg: m.Message) -> None:
        self.sent.append((identity, msg))

    def _stats(self, groups: list[Group]) -> dict[str, object]:
        self.stats_calls += 1
        return {"groups": len(groups)}

    def buffer_groups(self, n: int, version: int = 0) -> None:
        """Take n groups through the ledger (generated, scored) into the buffer."""
        taken = self.ledger.take_for_generation("gen", n, now=0.0)
        assert taken is not None
        lease, _ = taken
        for gid in sorted(lease.group_ids):
            assert self.ledger.accept_rollout(gid)
            scoring = self.ledger.take_for_scoring("scorer", now=0.0)
            assert scoring is not None and self.ledger.accept_scored(gid)
            self.buffer.add(group(gid, version))


def request(step: int, rank: int = 0, world: int = 1) -> m.BatchRequest:
    return m.BatchRequest(step=step, trainer_version=step, rank=rank, world_size=world)


def test_two_ranks_get_their_shards_once_both_asked() -> None:
    d = Desk()
    d.buffer_groups(GPS)
    d.desk.add(b"r0", request(0, 0, 2))
    d.desk.serve()
    assert d.sent == []  # rank 1 has not asked yet
    d.desk.add(b"r1", request(0, 1, 2))
    d.desk.serve()
    shards = {ident: msg for ident, msg in d.sent if isinstance(msg, m.TrainBatch)}
    assert set(shards) == {b"r0", b"r1"}
    ids = {k: list(np.asarray(v.group_ids)) for k, v in shards.items()}
    assert sorted(ids[b"r0"] + ids[b"r1"]) == [0, 1, 2, 3] and len(ids[b"r0"]) == 2
    assert d.ledger.summary()["trained"] == GPS and d.stats_calls == 1
    totals = {v.stats["num_seqs_total"] for v in shards.values()}
    assert totals == {8}  # both ranks know the whole step's size


def test_a_step_waits_for_enough_groups() -> None:
    d = Desk()
    d.buffer_groups(GPS - 1)
    d.desk.add(b"r0", request(0))
    d.desk.serve()
    assert d.sent == []
    d.buffer_groups(1)
    d.desk.serve()
    assert len(d.sent) == 1 and d.ledger.summary()["trained"] == GPS


def test_a_lost_ranks_request_is_dropped() -> None:
    d = Desk()
    d.buffer_groups(GPS)
    d.desk.add(b"r0", request(0))
    d.desk.drop(b"r0")
    d.desk.serve()
    assert d.sent == [] and d.ledger.summary()["trained"] == 0


def test_groups_too_stale_for_the_trainer_are_counted_stale_not_sent() -> None:
    d = Desk(staleness=0)
    d.buffer_groups(GPS, version=0)
    d.desk.add(b"r0", request(1))  # the trainer is at version 1: version-0 groups are stale
    d.desk.serve()
    assert d.sent == []
    assert d.ledger.summary()["stale"] == GPS
