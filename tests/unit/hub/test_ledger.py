"""The hub's ledger: leases, re-dispatch, duplicates, the staleness gate, accounting."""

from __future__ import annotations

import pytest

from grpo_stream.hub.ledger import Ledger


def make(gps: int = 4, staleness: int = 1) -> Ledger:
    return Ledger(groups_per_step=gps, max_staleness=staleness, lease_timeout_s=10.0)


def test_gate_lets_out_groups_per_step_times_staleness_plus_one() -> None:
    ledger = make(gps=4, staleness=1)
    lease, _ = ledger.take_for_generation("g0", 100, now=0.0) or (None, 0)
    assert lease is not None and len(lease.group_ids) == 8
    assert ledger.take_for_generation("g0", 1, now=0.0) is None


def test_sync_gate_dispatches_one_step_at_the_trainers_version() -> None:
    ledger = make(gps=4, staleness=0)
    ledger.versions.next_version = 3
    lease, min_version = ledger.take_for_generation("g0", 100, now=0.0) or (None, -1)
    assert lease is not None and len(lease.group_ids) == 4
    assert min_version == 3


def test_second_step_of_async_window_needs_the_next_version() -> None:
    ledger = make(gps=4, staleness=1)
    ledger.versions.next_version = 5
    _, first = ledger.take_for_generation("g0", 4, now=0.0) or (None, -1)
    _, second = ledger.take_for_generation("g0", 4, now=0.0) or (None, -1)
    assert (first, second) == (4, 5)


def test_lost_holder_groups_are_redispatched_first_and_counted_once() -> None:
    ledger = make()
    lease, _ = ledger.take_for_generation("g0", 3, now=0.0) or (None, 0)
    assert lease is not None
    assert ledger.release_holder("g0") == 3
    again, _ = ledger.take_for_generation("g1", 3, now=0.0) or (None, 0)
    assert again is not None and again.group_ids == lease.group_ids
    assert ledger.counters["dispatched"] == 3 and ledger.counters["redispatched"] == 3
    ledger.check_invariant()


def test_duplicate_rollout_is_dropped() -> None:
    ledger = make()
    lease, _ = ledger.take_for_generation("g0", 1, now=0.0) or (None, 0)
    assert lease is not None
    (gid,) = lease.group_ids
    assert ledger.accept_rollout(gid)
    assert not ledger.accept_rollout(gid)
    assert ledger.counters["duplicates_dropped"] == 1


def test_late_rollout_from_a_lost_holder_is_accepted_once_and_not_regenerated() -> None:
    ledger = make()
    lease, _ = ledger.take_for_generation("g0", 1, now=0.0) or (None, 0)
    assert lease is not None
    (gid,) = lease.group_ids
    ledger.release_holder("g0")
    assert ledger.accept_rollout(gid)
    assert gid not in ledger.retry
    assert ledger.take_for_generation("g1", 100, now=0.0) is not None  # new indices only
    assert ledger.stage[gid] == "to_score"


def test_expired_lease_is_requeued() -> None:
    ledger = make()
    ledger.take_for_generation("g0", 2, now=0.0)
    assert ledger.expire(now=11.0) == 2
    assert len(ledger.retry) == 2


def test_scoring_lease_lost_goes_back_to_the_score_queue() -> None:
    ledger = make()
    lease, _ = ledger.take_for_generation("g0", 1, now=0.0) or (None, 0)
    assert lease is not None
    (gid,) = lease.group_ids
    ledger.accept_rollout(gid)
    taken = ledger.take_for_scoring("s0", now=0.0)
    assert taken is not None and taken[1] == gid
    ledger.release_holder("s0")
    assert list(ledger.to_score) == [gid]
    assert ledger.accept_scored(gid)
    assert not ledger.accept_scored(gid)


@pytest.mark.parametrize("outcome", ["trained", "filtered", "stale", "failed"])
def test_every_group_ends_once(outcome: str) -> None:
    ledger = make()
    lease, _ = ledger.take_for_generation("g0", 2, now=0.0) or (None, 0)
    assert lease is not None
    for gid in sorted(lease.group_ids):
        ledger.accept_rollout(gid)
        ledger.take_for_scoring("s0", now=0.0)
        ledger.accept_scored(gid)
        ledger.finish(gid, outcome)  # type: ignore[arg-type]
    ledger.check_invariant()
    assert ledger.counters[outcome] == 2 and ledger.in_pipeline() == 0


def test_invariant_detects_a_lost_group() -> None:
    ledger = make()
    ledger.take_for_generation("g0", 2, now=0.0)
    del ledger.stage[0]
    with pytest.raises(AssertionError, match="accounting"):
        ledger.check_invariant()


def test_a_served_step_moves_the_gate_to_the_next_version_not_the_named_one() -> None:
    ledger = make(staleness=1)
    ledger.versions.observe_trainer(3)
    ledger.step_served(3)
    versions = ledger.versions
    assert versions.trainer_version == 3  # what Welcome and Status tell: the trainer named 3
    assert versions.is_stale(2) and not versions.is_stale(3)  # judged at 4, its next request


def test_held_by_counts_what_each_generator_is_generating_through_its_leases() -> None:
    ledger = make(gps=8, staleness=1)
    taken = ledger.take_for_generation("gen-a", 3, now=0.0)
    assert taken is not None
    a, _ = taken
    ledger.take_for_generation("gen-b", 2, now=5.0)
    assert ledger.leases.held_by() == {"gen-a": 3, "gen-b": 2}
    ledger.accept_rollout(min(a.group_ids))  # one of gen-a's came back
    assert ledger.leases.held_by() == {"gen-a": 2, "gen-b": 2}
    ledger.release_holder("gen-b")  # lost: its groups are queued, held by nobody
    assert ledger.leases.held_by() == {"gen-a": 2}
    ledger.expire(now=11.0)  # gen-a's lease is late
    assert ledger.leases.held_by() == {}
    ledger.take_for_generation("gen-c", 4, now=12.0)  # the retries first
    assert ledger.leases.held_by() == {"gen-c": 4}


def test_a_result_names_a_lease_issued_to_its_sender_on_that_group() -> None:
    led = Ledger(groups_per_step=4, max_staleness=1, lease_timeout_s=10.0)
    taken = led.take_for_generation("gen-0", 2, now=0.0)
    assert taken is not None
    lease, _ = taken
    gid, book = min(lease.group_ids), led.leases
    assert book.issued_to(lease.lease_id, gid, "gen-0", "generate") is None
    assert "not gen-1's" in str(book.issued_to(lease.lease_id, gid, "gen-1", "generate"))
    assert "not gen-0's score" in str(book.issued_to(lease.lease_id, gid, "gen-0", "score"))
    assert "group 999" in str(book.issued_to(lease.lease_id, 999, "gen-0", "generate"))
    assert "never issued" in str(book.issued_to(lease.lease_id + 50, gid, "gen-0", "generate"))
    led.release_holder("gen-0")  # closed, still its own: a late result is a duplicate, not a lie
    assert book.issued_to(lease.lease_id, gid, "gen-0", "generate") is None
