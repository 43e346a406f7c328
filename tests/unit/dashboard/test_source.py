"""Where a run stands and its service graph, polled from a real hub (live), from the run
directory (over: completed, dead), or not at all (unreachable)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo_stream.config.transport import SecuritySettings
from grpo_stream.dashboard import source as source_module
from grpo_stream.dashboard.graph import Rates, steps_per_s
from grpo_stream.dashboard.source import RunSource
from grpo_stream.rundir.outcome import write_outcome
from grpo_stream.transport.curve import init_keys

from ..rundir.holder import held_elsewhere
from .live_hub import LiveHub


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[LiveHub]:
    live = LiveHub(tmp_path)
    (tmp_path / "config.toml").write_text(live.cfg.to_toml())
    yield live
    live.close()


def _nodes(update: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["instance"]: n for n in update["graph"]["nodes"]}


def _poll(source: RunSource) -> dict[str, Any]:
    return source.apply(source.poll())


def test_a_live_run_shows_every_service_the_hub_lists(tmp_path: Path, hub: LiveHub) -> None:
    hub.join("trainer", "trainer-0")
    hub.join("generator", "generator-0", tokens_per_s=1234.0, version=7)
    hub.join("scorer", "scorer-0", groups_scored=10)
    source = RunSource(tmp_path)
    try:
        update = _poll(source)
    finally:
        source.close()
    assert update["run"]["phase"] == "live" and update["run"]["hub"] == hub.address
    nodes = _nodes(update)
    assert set(nodes) == {"grouper-0", "trainer-0", "generator-0", "scorer-0"}
    assert all(n["state"] == "running" for n in nodes.values())
    gen = nodes["generator-0"]
    assert (gen["throughput"], gen["unit"], gen["version"], gen["credits"]) == (
        1234.0, "tok/s", 7, 3,
    )  # fmt: skip
    assert gen["host"] == "host-a"
    assert {"in_progress", "buffer", "to_score", "trained"} <= set(update["graph"]["queues"])


def test_a_service_the_hub_stops_listing_is_shown_lost(tmp_path: Path, hub: LiveHub) -> None:
    hub.join("trainer", "trainer-0")
    hub.join("generator", "generator-0")
    source = RunSource(tmp_path)
    try:
        _poll(source)
        hub.leave("generator-0")
        nodes = _nodes(_poll(source))
        hub.join("generator", "generator-0")
        back = _nodes(_poll(source))
    finally:
        source.close()
    assert nodes["generator-0"]["state"] == "lost" and nodes["trainer-0"]["state"] == "running"
    assert back["generator-0"]["state"] == "running"


def test_a_hub_alone_is_read_without_a_run_directory(hub: LiveHub) -> None:
    hub.join("scorer", "scorer-0")
    source = RunSource(None, hub=hub.address)
    try:
        update = _poll(source)
    finally:
        source.close()
    assert update["run"]["phase"] == "live" and update["files"] is None
    assert "scorer-0" in _nodes(update)
    assert source.snapshot()["files"] is None


def test_a_finished_run_is_drawn_from_its_logs_without_asking_a_hub(tmp_path: Path) -> None:
    (tmp_path / "hub.addr").write_text("tcp://127.0.0.1:9\n")  # nobody there
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "counters.json").write_text(json.dumps({"trained": 40, "buffer": 2}))
    (tmp_path / "logs").mkdir()
    for service in ("grouper", "trainer", "generator", "scorer"):
        event = {"event": "x.ready", "level": "info", "t": 1.0, "service": service,
                 "instance": f"{service}-0", "device": "cpu"}  # fmt: skip
        (tmp_path / "logs" / f"{service}-{service}-0.jsonl").write_text(json.dumps(event) + "\n")
    write_outcome(tmp_path, "completed", 40)
    source = RunSource(tmp_path)
    update = _poll(source)
    assert update["run"]["phase"] == "completed"
    nodes = _nodes(update)
    assert set(nodes) == {"grouper-0", "trainer-0", "generator-0", "scorer-0"}
    assert {n["state"] for n in nodes.values()} == {"stopped"}
    assert update["graph"]["queues"] == {"trained": 40, "buffer": 2}


def test_a_run_nobody_holds_that_recorded_no_end_is_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source_module, "STATUS_TIMEOUT_S", 0.3)
    (tmp_path / "hub.addr").write_text("tcp://127.0.0.1:9\n")
    update = _poll(RunSource(tmp_path))
    assert update["run"]["phase"] == "dead" and "killed?" in update["run"]["reason"]


def test_a_held_run_whose_hub_does_not_answer_is_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source_module, "STATUS_TIMEOUT_S", 0.3)
    (tmp_path / "hub.addr").write_text("tcp://127.0.0.1:9\n")
    with held_elsewhere(tmp_path):
        update = _poll(RunSource(tmp_path))
    assert update["run"]["phase"] == "unreachable"
    assert "no answer from the hub at tcp://127.0.0.1:9" in update["run"]["problems"][0]


def test_the_hub_is_asked_with_the_runs_own_security_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source_module, "STATUS_TIMEOUT_S", 1.0)
    keys = tmp_path / "keys"
    init_keys(keys)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    live = LiveHub(run_dir, ["security.curve=true", f'security.keys_dir="{keys}"'])
    try:
        (run_dir / "config.toml").write_text(live.cfg.to_toml())
        live.join("trainer", "trainer-0")
        as_configured = RunSource(run_dir)
        plain = RunSource(run_dir, security=SecuritySettings())  # no keys: CURVE refuses it
        try:
            assert _poll(as_configured)["run"]["phase"] == "live"
            assert _poll(plain)["run"]["phase"] != "live"
        finally:
            as_configured.close()
            plain.close()
    finally:
        live.close()


def test_rates_are_the_change_per_second_between_two_polls() -> None:
    rates = Rates()
    assert rates.rate("scored", 10.0, now=100.0) is None  # first sight
    assert rates.rate("scored", 40.0, now=102.0) == 15.0
    assert rates.rate("scored", 5.0, now=103.0) is None  # the counter restarted


def test_trainer_steps_per_second_come_from_the_last_metrics_rows() -> None:
    rows = [{"step": s, "wall_time": 10.0 + 0.5 * s} for s in range(1, 30)]
    assert steps_per_s(rows) == pytest.approx(2.0)
    assert steps_per_s(rows[:1]) is None
