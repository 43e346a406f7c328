"""bench.dashboard: its smoke mode runs the real dashboard process on a made-up finished run
and measures it idle and with a page reading its event stream."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_the_smoke_mode_measures_the_process_idle_and_with_a_page_open(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("uvicorn")
    monkeypatch.syspath_prepend(str(REPO))
    bench = importlib.import_module("bench.dashboard")
    bench.main(["--smoke"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("dashboard CPU s/s: idle ") and "page open" in last
    got = bench.smoke(seconds=1.0)
    assert got["events"] >= 2  # the snapshot, then updates while the page is open
    for key in ("startup_cpu_s", "idle_cpu_s_per_s", "page_cpu_s_per_s"):
        assert math.isfinite(got[key]) and got[key] >= 0


def test_the_full_mode_refuses_too_few_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    bench = importlib.import_module("bench.dashboard")
    with pytest.raises(SystemExit, match="--steps"):
        bench.main(["--steps", "2"])
