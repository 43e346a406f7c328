"""Versions unique forever: the mark survives a reopen, and a resumed trainer continues
above every announced version by more than the staleness budget."""

from __future__ import annotations

from pathlib import Path

from grpo_stream.hub.ledger import Ledger
from grpo_stream.training.versions import VersionMark, resumed_version


def test_the_mark_keeps_the_highest_version_recorded(tmp_path: Path) -> None:
    mark = VersionMark(tmp_path)
    assert mark.highest() is None
    mark.record(7)
    mark.record(5)  # never lowered
    assert VersionMark(tmp_path).highest() == 7


def test_a_trainer_resumed_behind_the_mark_publishes_above_it() -> None:
    version = resumed_version(checkpoint_version=50, mark=60, max_staleness=1)
    assert version > 60


def test_what_the_discarded_versions_generated_is_stale_at_the_resumed_version() -> None:
    ledger = Ledger(groups_per_step=4, max_staleness=2, lease_timeout_s=10.0)
    ledger.versions.observe_trainer(
        resumed_version(checkpoint_version=50, mark=60, max_staleness=2)
    )
    assert all(ledger.versions.is_stale(v) for v in range(51, 61))  # the discarded timeline


def test_a_trainer_resumed_at_the_newest_version_keeps_it() -> None:
    assert resumed_version(checkpoint_version=60, mark=60, max_staleness=1) == 60
    assert resumed_version(checkpoint_version=10, mark=None, max_staleness=1) == 10
