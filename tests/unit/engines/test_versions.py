"""The generator's version tracker: one rule for "behind", a restarted trainer's newest taken
whatever its number, failed fetches backed off, a fetched version the truth."""

from __future__ import annotations

from grpo_stream.engines.versions import FETCH_BACKOFF_MAX_S, VersionTracker


def test_an_engine_is_behind_only_a_newer_announced_version() -> None:
    tracker = VersionTracker()
    tracker.heard(3)
    tracker.heard(2)  # an older announcement arriving late changes nothing
    assert (tracker.behind(2), tracker.behind(3), tracker.behind(4)) == (True, False, False)


def test_after_a_trainer_restart_its_newest_is_fetched_whatever_its_number() -> None:
    tracker = VersionTracker()
    tracker.heard(7)
    tracker.trainer_restarted()
    assert tracker.behind(7) and tracker.behind(9) and tracker.restarts == 1


def test_failed_fetches_back_off_doubling_up_to_the_cap_and_then_reload() -> None:
    tracker = VersionTracker()
    backoffs = [tracker.failed(now=100.0) for _ in range(8)]
    assert backoffs == [1.0, 2.0, 4.0, 8.0, 16.0, FETCH_BACKOFF_MAX_S, 30.0, 30.0]
    assert not tracker.may_fetch(100.0 + 29.9) and tracker.may_fetch(100.0 + 30.0)
    assert tracker.reload and tracker.behind(10**6)


def test_a_fetched_version_is_the_truth_and_ends_the_backoff() -> None:
    tracker = VersionTracker()
    tracker.heard(9)
    tracker.failed(now=0.0)
    tracker.applied(4, fresh=True)  # the restarted server's newest is older than announced
    assert (tracker.announced, tracker.failures, tracker.reload) == (4, 0, False)
    assert not tracker.behind(4)


def test_a_version_fetched_from_before_a_restart_leaves_the_reload_pending() -> None:
    tracker = VersionTracker()
    tracker.trainer_restarted()
    tracker.applied(5, fresh=False)
    assert tracker.reload and tracker.behind(5)
