"""A user's first hour, end to end: one run per run directory (a second `up` refused at once,
`--resume` after SIGKILL with no cleanup), `status` on the finished run, a console that fits
the terminal, and a task the model cannot solve reported as a stall, not silence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from grpo_stream.logs import merge_logs

from .conftest import Run, metrics, status, up_command

pytestmark = pytest.mark.slow

WIDTH = 80


def _up(
    run_dir: Path, steps: int, *extra: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(WIDTH)}
    cmd = up_command(run_dir, steps, *extra)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _status(run_dir: Path) -> str:
    cmd = [sys.executable, "-m", "grpo_stream.cli.main", "status", str(run_dir)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout


def test_one_run_per_run_dir_and_resume_after_sigkill(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = Run(run_dir, 200)
    try:
        first.wait_steps(1)
        pids = [int(s["pid"]) for s in status(run_dir)["services"]]
        second = _up(run_dir, 200, timeout=60)
        assert second.returncode == 2
        assert f"in use by pid {first.proc.pid} on host" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        os.kill(first.proc.pid, signal.SIGKILL)  # its services die with it (PDEATHSIG)
        first.proc.wait()
    finally:
        first.kill()
    _wait_gone(pids)
    done = max(row["step"] for row in metrics(run_dir))
    resumed = _up(run_dir, done + 2, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_readable_console(resumed.stderr)
    text = _status(run_dir)
    assert "completed" in text and f"after {done + 2} steps" in text


def _wait_gone(pids: list[int], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"services {alive} outlived their up")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _assert_readable_console(console: str) -> None:
    rows = [row for row in console.splitlines() if row.strip()]
    assert all(len(row) <= WIDTH for row in rows), max(rows, key=len)
    assert "Traceback" not in console
    lines: list[str] = []  # logical lines: a row that starts with a space continues one
    for row in rows:
        if row.startswith(" ") and lines:
            lines[-1] += " " + row.strip()
        else:
            lines.append(row)
    repeats = {line: n for line, n in Counter(lines).items() if n > 1}
    assert not repeats, repeats  # a short run: nothing may repeat within its minute
    assert "report.png" not in lines[-1] or "report in" in lines[-1]


def test_a_task_the_model_cannot_solve_is_reported_as_zero_signal_within_35s(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    hard = ["--set", "task.max_operand=100000", "--set", 'task.ops="*"']
    result = _up(run_dir, 5, *hard, "--set", "run.stall_abort_s=33", timeout=300)
    assert result.returncode == 1
    assert "zero-signal" in result.stderr.strip().splitlines()[-1]  # the reason up stops with
    events = merge_logs(run_dir)
    asked = min(e["t"] for e in events if e["event"] == "trainer.ready")
    stalls = [e for e in events if e["event"] == "hub.stall" and "zero-signal" in e["why"]]
    assert stalls, [e for e in events if e["event"] == "hub.stall"]
    assert stalls[0]["t"] - asked <= 35.0
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["ended"] == "failed" and "run.stall_abort_s" in outcome["reason"]
