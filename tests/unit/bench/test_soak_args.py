"""bench/soak.py: its options and the pass/fail rules, without running a pipeline."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]
BALANCED = {"dispatched": 10, "trained": 6, "filtered": 1, "stale": 1, "failed": 0,
            "in_progress": 2}  # fmt: skip


@pytest.fixture
def soak(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO))
    return importlib.import_module("bench.soak")


def test_defaults_are_twenty_minutes_and_ten_percent(soak: ModuleType) -> None:
    args = soak.build_parser().parse_args([])
    assert args.minutes == 20.0
    assert args.rss_growth == pytest.approx(0.10)


def test_minutes_kill_every_and_overrides_parse(soak: ModuleType) -> None:
    args = soak.build_parser().parse_args(
        ["--minutes", "1", "--kill-every", "15", "--set", "generator.count=2"]
    )
    assert (args.minutes, args.kill_every, args.overrides) == (1.0, 15.0, ["generator.count=2"])


def test_clean_run_has_no_failures(soak: ModuleType) -> None:
    rss = {"hub": 100, "trainer-0": 200}
    assert soak.check(rss, {"hub": 105, "trainer-0": 210}, BALANCED, [1, 2, 3], 0.10) == []


def test_rss_growth_over_the_limit_fails(soak: ModuleType) -> None:
    failures = soak.check({"hub": 100}, {"hub": 111}, BALANCED, [1], 0.10)
    assert len(failures) == 1 and failures[0].startswith("rss: hub")


def test_group_sent_twice_fails(soak: ModuleType) -> None:
    failures = soak.check({}, {}, BALANCED, [1, 2, 2], 0.10)
    assert failures == ["groups sent twice: [2]"]


def test_unbalanced_ledger_fails(soak: ModuleType) -> None:
    counters = dict(BALANCED, dispatched=11)
    assert soak.check({}, {}, counters, [1], 0.10)[0].startswith("ledger:")
