"""The ledger through the hub's checkpoint: leased groups requeued, versions and counters kept,
leases forgotten."""

from __future__ import annotations

from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.ledger_state import ledger_state, load_ledger


def make(gps: int = 4, staleness: int = 1) -> Ledger:
    return Ledger(groups_per_step=gps, max_staleness=staleness, lease_timeout_s=10.0)


def test_state_round_trip_requeues_leased_groups() -> None:
    ledger = make()
    ledger.take_for_generation("g0", 3, now=0.0)
    restored = make()
    load_ledger(restored, ledger_state(ledger), scored=set())
    assert sorted(restored.retry) == [0, 1, 2]
    assert restored.cursor == 3 and restored.counters["dispatched"] == 3
    restored.check_invariant()


def test_restore_without_rollouts_sends_groups_awaiting_a_score_back_to_generation() -> None:
    ledger = make()
    ledger.take_for_generation("g0", 3, now=0.0)
    assert ledger.accept_rollout(0) and ledger.accept_rollout(1)
    ledger.take_for_scoring("s0", now=0.0)  # group 0 scoring, group 1 waiting for a scorer
    restored = make()
    load_ledger(restored, ledger_state(ledger), scored=set())
    assert list(restored.to_score) == []  # nothing to score without its rollout
    assert restored.take_for_scoring("s0", now=0.0) is None
    assert sorted(restored.retry) == [0, 1, 2]
    restored.check_invariant()


def test_the_trainers_version_survives_a_checkpoint() -> None:
    ledger = make()
    ledger.versions.observe_trainer(7)
    ledger.step_served(7)
    restored = make()
    load_ledger(restored, ledger_state(ledger), scored=set())
    assert (restored.versions.trainer_version, restored.versions.next_version) == (7, 8)


def test_leases_from_before_a_restart_are_not_remembered() -> None:
    led = Ledger(groups_per_step=4, max_staleness=1, lease_timeout_s=10.0)
    taken = led.take_for_generation("gen-0", 2, now=0.0)
    assert taken is not None
    again = Ledger(groups_per_step=4, max_staleness=1, lease_timeout_s=10.0)
    load_ledger(again, ledger_state(led), scored=set())
    book = again.leases
    assert book.issued_to(taken[0].lease_id, 0, "gen-9", "generate") is None
    assert "never issued" in str(book.issued_to(taken[0].lease_id + 1, 0, "gen-9", "generate"))
