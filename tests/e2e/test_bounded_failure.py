"""A reward that fails on every completion of the run: the run stops within a minute with one
line naming the reward and its last error (with the user's file and line), the traceback is
shown once (not once per completion), and the scorer's log stays small (warnings are
rate-limited). Pre-flight's call passes: the reward fails from its second call on, as one
that reads a key only some references have would."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from .conftest import Run, hub_events

pytestmark = pytest.mark.slow

FAILING = """
import os

def always_fails(completion, **_):
    if os.environ.get("FAILED_ONCE"):
        raise ValueError("verifier unavailable")
    os.environ["FAILED_ONCE"] = "1"  # this process: pre-flight's worker, or a scorer's
    return 0.0
"""


def test_an_always_failing_reward_stops_the_run_with_its_name_and_error(
    tmp_path: Path, background_run: list[Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "failing_reward.py").write_text(FAILING)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    run = Run(tmp_path / "run", 200, "--set", 'task.rewards=[{name="failing_reward:always_fails"}]')
    background_run.append(run)
    code = run.finish(timeout=180)
    out = Path(run.log.name).read_text()
    assert code != 0, out[-2000:]
    (aborted,) = hub_events(run.run_dir, "run.aborted")
    assert "failing_reward:always_fails" in aborted["error"]
    assert "verifier unavailable" in aborted["error"]
    assert "the hub stopped the run" in out and "verifier unavailable" in out
    started = min(_when(e) for e in hub_events(run.run_dir, "hub.started"))
    assert (_when(aborted) - started).total_seconds() < 60
    scorer_logs = list((run.run_dir / "logs").glob("scorer-*.jsonl"))
    assert scorer_logs and all(p.stat().st_size < 1_000_000 for p in scorer_logs)
    assert "failing_reward.py:6 in always_fails" in aborted["error"]
    tracebacks = [e for p in scorer_logs for e in _events(p) if e["event"] == "reward.error"]
    assert len(tracebacks) == 1  # once per distinct error, not once per completion
    assert 'failing_reward.py", line 6, in always_fails' in tracebacks[0]["traceback"]
    shown = " ".join(out.split())  # the console wraps long lines at spaces
    assert 'failing_reward.py", line 6, in always_fails' in shown  # on the console too


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _when(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(event["ts"]))
