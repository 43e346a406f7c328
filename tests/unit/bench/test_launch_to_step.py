"""bench.launch_to_step: its smoke mode builds every launcher's command and passes the local
pre-flight in seconds; the report puts each launcher beside local."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_smoke_mode_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "bench.launch_to_step", "--smoke"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "pre-flight passed" in result.stdout
    for name in ("local", "slurm", "ray"):
        assert f"\n{name}" in "\n" + result.stdout


def test_report_divides_each_median_by_locals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from bench.launch_to_step import report

    out = report({"local": [10.0, 12.0, 11.0], "slurm": [13.2], "ray": []}, ["1 1 1"])
    rows = out["launchers"]
    assert rows["local"]["median_s"] == 11.0 and rows["local"]["vs_local"] == 1.0
    assert rows["slurm"]["vs_local"] == pytest.approx(1.2)
    assert rows["ray"]["median_s"] is None and rows["ray"]["vs_local"] is None
