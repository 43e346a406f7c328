"""Structured logs: JSON files per service, bound fields, merging in time order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from grpo_stream.cli.main import app
from grpo_stream.logs import CHILD_ENV, follow_logs, merge_logs, setup_logging

CHILD = """
import logging, structlog
from grpo_stream.logs import setup_child_logging
print(setup_child_logging(), flush=True)
structlog.get_logger().debug("vllm_worker.weights_received", version=3)
structlog.get_logger().info("worker.ready")
logging.getLogger("vllm.engine").info("chatter")
logging.getLogger("vllm.engine").warning("careful")
"""
"""A process a library spawns from a service (as vLLM spawns its engine core)."""


def test_events_go_to_the_service_file_with_bound_fields(tmp_path: Path) -> None:
    log = setup_logging("trainer", "t0", tmp_path, console=False)
    log.info("weights.published", version=7)
    lines = (tmp_path / "logs" / "trainer-t0.jsonl").read_text().splitlines()
    event = json.loads(lines[-1])
    assert event["event"] == "weights.published" and event["version"] == 7
    assert event["service"] == "trainer" and event["instance"] == "t0"


def _write(path: Path, events: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_merge_orders_by_time_and_filters(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    _write(
        tmp_path / "logs" / "a.jsonl",
        [
            {"t": 1.0, "event": "a1", "service": "hub", "level": "info"},
            {"t": 3.0, "event": "a3", "service": "hub", "level": "error"},
        ],
    )
    _write(
        tmp_path / "logs" / "b.jsonl",
        [{"t": 2.0, "event": "b2", "service": "trainer", "level": "info"}],
    )
    assert [e["event"] for e in merge_logs(tmp_path)] == ["a1", "b2", "a3"]
    assert [e["event"] for e in merge_logs(tmp_path, service="trainer")] == ["b2"]
    assert [e["event"] for e in merge_logs(tmp_path, level="error")] == ["a3"]


def test_partial_last_line_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.jsonl").write_text('{"t": 1, "event": "ok"}\n{"t": 2, "ev')
    assert [e["event"] for e in merge_logs(tmp_path)] == ["ok"]


def _next_within(events: Iterator[dict[str, Any]], seconds: float) -> dict[str, Any] | None:
    """The generator's next event, or None when none came within `seconds`."""
    got: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: got.append(next(events)), daemon=True)
    thread.start()
    thread.join(seconds)
    return got[0] if got else None


def test_following_a_log_rewritten_shorter_reads_it_again_from_its_top(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    path = tmp_path / "logs" / "a.jsonl"
    _write(path, [{"t": float(i), "event": f"old{i}"} for i in range(5)])
    events = follow_logs(tmp_path, poll_s=0.01)
    assert [_next_within(events, 10.0) for _ in range(5)][-1] == {"t": 4.0, "event": "old4"}
    _write(path, [{"t": 9.0, "event": "new"}])  # a resumed service's fresh file
    assert _next_within(events, 10.0) == {"t": 9.0, "event": "new"}


def test_logs_command_prints_merged_json(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    _write(tmp_path / "logs" / "a.jsonl", [{"t": 1.0, "event": "x", "service": "hub"}])
    result = CliRunner().invoke(app, ["logs", str(tmp_path), "--json"])
    assert result.exit_code == 0 and json.loads(result.output.strip())["event"] == "x"


def test_logs_command_fails_on_missing_dir(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["logs", str(tmp_path / "nope")])
    assert result.exit_code != 0


def test_library_log_records_land_in_the_service_file_marked_with_their_logger(
    tmp_path: Path,
) -> None:
    import logging

    setup_logging("generator", "g0", tmp_path, console=False)
    logging.getLogger("vllm.engine").info("KV cache %d blocks", 12)
    lines = (tmp_path / "logs" / "generator-g0.jsonl").read_text().splitlines()
    event = json.loads(lines[-1])
    assert event["event"] == "library.log" and event["logger"] == "vllm.engine"
    assert event["message"] == "KV cache 12 blocks" and event["level"] == "info"
    assert event["service"] == "generator"


def test_a_process_a_library_spawns_logs_json_as_its_service_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CHILD_ENV, "")  # restored after the test (setup_logging sets it)
    setup_logging("generator", "g0", tmp_path, level="info", console_json=True)
    env = dict(os.environ)
    child = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=env
    )
    assert child.stdout.strip() == "True", child.stderr
    events = [json.loads(line) for line in child.stderr.splitlines()]
    seen = [(e["event"], e.get("logger"), e["level"]) for e in events]
    assert seen == [  # no debug; the library's records as events with their logger and level
        ("worker.ready", None, "info"),
        ("library.log", "vllm.engine", "info"),
        ("library.log", "vllm.engine", "warning"),
    ]
    assert {(e["service"], e["instance"]) for e in events} == {("generator", "g0")}
    written = (tmp_path / "logs" / "generator-g0.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in written][-3:] == [e[0] for e in seen]


def test_a_process_not_spawned_from_a_service_sets_nothing_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CHILD_ENV, raising=False)
    env = {k: v for k, v in os.environ.items() if k != CHILD_ENV}
    child = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=env
    )
    assert child.stdout.splitlines()[0] == "False"
