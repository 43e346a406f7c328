"""The batch desk: a step is served when all its ranks asked and its groups are fresh; each
rank gets its shard; first uses are counted trained once; a lost rank's request is dropped."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from grpo_stream.config import HubSettings
from grpo_stream.hub.batches import offline_stats
from grpo_stream.hub.journal import SendJournal
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.ledger_state import ledger_state, load_ledger
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

    def _stats(self, groups: list[Group]) -> m.StepStats:
        self.stats_calls += 1
        return offline_stats(groups)

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
    totals = {v.totals.num_seqs for v in shards.values()}
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


def batches(d: Desk) -> list[m.TrainBatch]:
    return [msg for _, msg in d.sent if isinstance(msg, m.TrainBatch)]


def test_a_repeated_request_gets_the_same_batch_and_counts_nothing_again() -> None:
    d = Desk()
    d.buffer_groups(2 * GPS)
    d.desk.add(b"r0", request(0))
    d.desk.serve()
    d.desk.add(b"r0", request(0))  # the batch was lost: the trainer asks again
    d.desk.serve()
    first, again = batches(d)
    assert list(again.group_ids) == list(first.group_ids)
    assert d.ledger.summary()["trained"] == GPS and len(d.buffer) == GPS


def test_a_new_attempt_at_a_skipped_step_gets_new_groups_and_discards_the_skipped_ones() -> None:
    d = Desk()
    d.buffer_groups(2 * GPS)
    d.desk.add(b"r0", request(0))
    d.desk.serve()
    d.desk.add(b"r0", m.BatchRequest(step=0, trainer_version=0, attempt=1))
    d.desk.serve()
    first, second = batches(d)
    assert not set(first.group_ids) & set(second.group_ids)
    summary = d.ledger.summary()
    assert summary["trained"] == GPS and summary["discarded"] == GPS
    d.ledger.check_invariant()


def test_a_trainer_that_went_back_has_its_discarded_steps_counted_discarded() -> None:
    d = Desk(staleness=3)
    d.buffer_groups(4 * GPS)
    for step in range(3):
        d.desk.add(b"r0", request(step))
        d.desk.serve()
    # resumed from its step-1 checkpoint under a new version: steps 1 and 2 are gone
    d.desk.add(b"r0", m.BatchRequest(step=1, trainer_version=3))
    d.desk.serve()
    summary = d.ledger.summary()
    assert summary["trained"] == 2 * GPS and summary["discarded"] == 2 * GPS
    d.ledger.check_invariant()


def test_a_restored_hub_never_sends_what_its_journal_says_left(tmp_path: Path) -> None:
    d = Desk(staleness=2)
    d.desk.journal = SendJournal(tmp_path / "sent.journal")
    d.buffer_groups(3 * GPS)
    d.desk.add(b"r0", request(0))
    d.desk.serve()
    ckpt = (ledger_state(d.ledger), d.buffer.state(), d.desk.state())
    d.desk.journal.reset()  # as the hub does after each checkpoint
    d.desk.add(b"r0", request(1))
    d.desk.serve()  # sent after the checkpoint: only the journal knows
    # the hub crashes; a new one restores the checkpoint and replays the journal
    r = Desk(staleness=2)
    load_ledger(r.ledger, ckpt[0], scored=set())
    r.buffer.load_state(ckpt[1])
    r.desk.load_state(ckpt[2])
    for record in SendJournal(tmp_path / "sent.journal").read():
        r.desk.replay(record)
    assert r.ledger.summary()["trained"] == 2 * GPS
    r.ledger.check_invariant()
    r.desk.add(b"r0", request(1))  # the trainer may not have got step 1: the same batch
    r.desk.add(b"r0", request(2))
    r.desk.serve()
    resent, new = batches(r)
    sent_before = [list(b.group_ids) for b in batches(d)]
    assert list(resent.group_ids) == sent_before[1]
    assert not set(new.group_ids) & {g for ids in sent_before for g in ids}


def test_a_restored_hub_counts_groups_dispatched_after_its_checkpoint(tmp_path: Path) -> None:
    d = Desk()
    d.desk.journal = SendJournal(tmp_path / "sent.journal")
    ckpt = ledger_state(d.ledger)  # before anything was dispatched
    taken = d.ledger.take_for_generation("gen", GPS + 2, now=0.0)  # groups 0..5
    assert taken is not None
    for gid in range(2, GPS + 2):  # 2..5 come back, are scored and sent; 0, 1 still out
        d.ledger.accept_rollout(gid)
        d.ledger.take_for_scoring("scorer", now=0.0)
        d.ledger.accept_scored(gid)
        d.buffer.add(group(gid))
    d.desk.add(b"r0", request(0))
    d.desk.serve()
    r = Desk()
    load_ledger(r.ledger, ckpt, scored=set())
    for record in SendJournal(tmp_path / "sent.journal").read():
        r.desk.replay(record)
    summary = r.ledger.summary()
    assert summary["trained"] == GPS and summary["dispatched"] == GPS + 2
    assert sorted(r.ledger.retry) == [0, 1]  # dispatched, never sent: generated again
    r.ledger.check_invariant()
