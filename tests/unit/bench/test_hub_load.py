"""bench/hub_load.py: its defaults, the hub settings it asks for, the window's numbers; and one
short real run (a real hub, simulated peers over ZeroMQ) that must deliver batches."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from grpo_stream.config import config_from_dict

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def hub_load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO))
    return importlib.import_module("bench.hub_load")


def test_defaults_are_the_issue_fleets_with_g8_and_1k_tokens(hub_load: ModuleType) -> None:
    args = hub_load.build_parser().parse_args([])
    assert args.generators == [8, 64, 256, 1024]
    assert (args.group_size, args.tokens) == (8, 1024)


def test_the_gate_lets_every_generator_hold_its_prompts_twice(
    hub_load: ModuleType, tmp_path: Path
) -> None:
    args = hub_load.build_parser().parse_args([])
    sets = hub_load.hub_settings(args, 1024, tmp_path)
    overrides = dict(s.split("=", 1) for s in sets[1::2])
    hub = config_from_dict(
        {"hub": {"groups_per_step": int(overrides["hub.groups_per_step"]),
                 "max_staleness": int(overrides["hub.max_staleness"])}}
    )  # fmt: skip
    capacity = hub.hub.groups_per_step * (hub.hub.max_staleness + 1)
    assert capacity >= 2 * 1024 * args.prompts_per_request


def test_each_mode_sets_the_hubs_payloads(hub_load: ModuleType, tmp_path: Path) -> None:
    args = hub_load.build_parser().parse_args([])
    assert args.payloads == ["hub", "direct"]  # before and after, in one run
    sets = hub_load.hub_settings(args, 8, tmp_path, "direct")
    assert "hub.payloads=direct" in sets[1::2]


def test_the_summary_counts_only_the_measured_window(hub_load: ModuleType) -> None:
    trainer = {"latencies_s": [0.5, 0.01], "stamps": [5.0, 15.0], "errors": {},
               "groups": [[5.0, 64, 999], [12.0, 64, 64_000], [14.0, 64, 64_000]]}  # fmt: skip
    empty = {"latencies_s": [], "stamps": [], "errors": {}, "groups": []}
    got = hub_load.summarize({"trainer": [trainer], "generator": [empty], "scorer": [empty]},
                             10.0, 20.0)  # fmt: skip
    assert got["groups_per_s"] == pytest.approx(12.8)
    assert got["completion_tokens_per_s"] == 12_800
    assert got["batch_p99_ms"] == pytest.approx(10.0)
    assert math.isnan(got["dispatch_p50_ms"])


@pytest.mark.slow
def test_a_short_run_delivers_batches_through_the_real_hub(
    hub_load: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # the simulated peers run as `python -m bench.hub_sim`
    out = tmp_path / "hub_load.json"
    argv = ["--generators", "16", "--seconds", "4", "--warmup", "2", "--offered", "100",
            "--tokens", "128", "--groups-per-step", "16", "--auth", "on",
            "--out", str(out)]  # fmt: skip
    assert hub_load.main(argv) == 0, sys.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["payloads"] for r in rows] == ["hub", "direct"]
    for row in rows:  # direct: the simulated peers fetched (and checked) every payload
        assert row["groups_per_s"] > 0 and row["dispatch_samples"] > 0
        assert row["errors_seen_by_peers"] == {}
        hub = row["hub"]
        done = sum(hub[k] for k in ("trained", "filtered", "stale", "failed"))
        assert hub["dispatched"] == done + hub["in_progress"]  # the ledger balances
        assert hub["rejected"] == {}
    assert out.with_suffix(".png").exists()


def test_smoke_measures_the_fleet_with_and_without_authentication(
    hub_load: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(REPO)  # the simulated peers run as `python -m bench.hub_sim`
    out = tmp_path / "smoke.json"
    assert hub_load.main(["--smoke", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["auth"], r["payloads"], r["generators"]) for r in rows] == [
        ("on", "hub", 8),
        ("off", "hub", 8),
    ]
    for row in rows:  # sealed or not, the hub took every message and trained
        assert row["groups_per_s"] > 0 and row["messages_per_s"] > 0
        assert row["errors_seen_by_peers"] == {} and row["hub"]["rejected"] == {}
    assert "auth on/off  payloads=hub generators=8: messages/s" in capsys.readouterr().out
