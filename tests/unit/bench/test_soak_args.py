"""bench/soak.py: its options and the pass/fail rules, without running a pipeline."""

from __future__ import annotations

import importlib
import json
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


def test_weight_feature_flags_become_overrides(soak: ModuleType) -> None:
    args = soak.build_parser().parse_args(
        ["--generators", "2", "--relay", "--inflight", "--max-tokens", "48"]
    )
    assert soak.feature_overrides(args) == [
        "generator.count=2", "weights.deltas=true", "weights.delta_max_ratio=1.0",
        "weights.relay=true", "weights.fanout=1",
        "generator.inflight_updates=true", "generator.max_tokens=48",
    ]  # fmt: skip


def test_no_deltas_turns_them_off_and_the_default_adds_nothing_else(soak: ModuleType) -> None:
    args = soak.build_parser().parse_args(["--no-deltas"])
    assert soak.feature_overrides(args) == ["generator.count=1", "weights.deltas=false"]


def test_kills_go_round_the_generators(soak: ModuleType) -> None:
    assert [soak.kill_target(k, 2) for k in range(3)] == [
        "generator-0", "generator-1", "generator-0",
    ]  # fmt: skip
    assert soak.kill_target(5, 1) == "generator-0"


def test_relays_on_but_never_used_fails(soak: ModuleType) -> None:
    unused = {"weights.sent_to_relay": 0}
    failures = soak.check({}, {}, BALANCED, [1], 0.10, unused, relay=True)
    assert failures == ["relay: no fetcher was redirected to a relay"]
    used = {"weights.sent_to_relay": 3}
    assert soak.check({}, {}, BALANCED, [1], 0.10, used, relay=True) == []


def test_weight_events_sum_rate_limited_counts(soak: ModuleType, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    rows = [
        {"event": "weights.applied", "version": 1},
        {"event": "weights.applied"},
        {"event": "weights.sent_to_relay", "count": 4, "base": -1},
        {"event": "weights.sent_to_relay", "count": 2, "base": 6},
        {"event": "batch.sent"},
    ]
    (logs / "trainer-0.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tally = soak.weight_events(tmp_path)
    assert tally["weights.applied"] == 2 and tally["weights.sent_to_relay"] == 6
    assert tally["weights.sent_to_relay.delta"] == 2
    assert tally["weights.refused"] == 0


def test_discarded_groups_are_accounted(soak: ModuleType) -> None:
    counters = dict(BALANCED, dispatched=12, discarded=2)  # trained, then rolled back
    assert soak.check({}, {}, counters, [1], 0.10) == []
