"""The dashboard `up` serves: a child process at a lower priority that says where it is,
stopped with the run; off when disabled; without its extra, or once it dies, `up` says so
and runs on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from grpo_stream.config import load_config
from grpo_stream.launch import dashboard as launch_dashboard
from grpo_stream.launch.dashboard import NICE, DashboardProcess


def _process(tmp_path: Path, *overrides: str) -> tuple[DashboardProcess, list[str]]:
    cfg = load_config(None, [f'run.run_dir="{tmp_path}"', "dashboard.port=0", *overrides])
    (tmp_path / "config.toml").write_text(cfg.to_toml())
    notes: list[str] = []
    return DashboardProcess(cfg, notes.append), notes


def _poll_until(process: DashboardProcess, notes: list[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not notes and time.monotonic() < deadline:
        process.poll()
        time.sleep(0.1)


def test_it_says_where_the_page_is_and_stops_with_the_run(tmp_path: Path) -> None:
    process, notes = _process(tmp_path)
    process.start()
    try:
        _poll_until(process, notes)
        proc = process.proc
        assert notes and notes[0].startswith("dashboard at http://127.0.0.1:")
        assert proc is not None
        assert psutil.Process(proc.pid).nice() == min(19, os.nice(0) + NICE)  # yields the CPU
        process.poll()
        assert len(notes) == 1  # said once
    finally:
        process.stop()
    assert proc is not None and proc.returncode is not None


def test_disabled_it_starts_nothing(tmp_path: Path) -> None:
    process, notes = _process(tmp_path, "dashboard.enabled=false")
    process.start()
    process.poll()
    assert process.proc is None and notes == []


def test_without_its_extra_up_says_so_once_and_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch_dashboard, "missing_extra", lambda: ["plotly"])
    process, notes = _process(tmp_path)
    process.start()
    process.poll()
    assert process.proc is None
    assert notes == [
        "no dashboard: plotly not installed (pip install 'grpo-stream[dashboard]', or "
        "dashboard.enabled = false)"
    ]


def test_a_dashboard_that_dies_is_reported_once(tmp_path: Path) -> None:
    process, notes = _process(tmp_path)
    (tmp_path / "config.toml").write_text('[dashboard]\nport = "not a port"\n')  # it cannot start
    process.start()
    _poll_until(process, notes)
    process.poll()
    assert len(notes) == 1 and "the dashboard exited with code 2" in notes[0]
    assert "logs/dashboard.log" in notes[0] and process.proc is None
    assert "invalid config" in (tmp_path / "logs" / "dashboard.log").read_text()
