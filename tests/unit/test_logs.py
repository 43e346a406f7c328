"""Structured logs: JSON files per service, bound fields, merging in time order."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from grpo_stream.cli.main import app
from grpo_stream.logs import merge_logs, setup_logging


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
