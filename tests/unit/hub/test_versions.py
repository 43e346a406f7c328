"""The hub's one owner of the trainer's version and of staleness."""

from __future__ import annotations

from grpo_stream.hub.versions import PolicyVersions
from grpo_stream.training.versions import resumed_version


def test_a_version_ahead_of_the_trainer_is_not_negatively_stale() -> None:
    versions = PolicyVersions(max_staleness=1)
    versions.observe_trainer(5)
    assert versions.staleness(14) == 0 and versions.staleness(3) == 2  # never negative
    assert versions.is_stale(3) and not versions.is_stale(4) and not versions.is_stale(9)


def test_the_version_a_resumed_trainer_continues_at_is_plausible_and_no_more() -> None:
    versions = PolicyVersions(max_staleness=2)
    versions.observe_trainer(60)  # the last version the trainer announced before a crash
    resumed = resumed_version(checkpoint_version=50, mark=60, max_staleness=2)
    assert versions.plausible_trainer_version() == resumed
