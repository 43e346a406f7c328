"""bench.curriculum: the mixed-difficulty dataset's levels and split, held-out reward against
wall time and at equal time, and (slow) its smoke run through real `grpo-stream up` runs."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO))
    return importlib.import_module("bench.curriculum")


def args(bench: ModuleType, *given: str) -> argparse.Namespace:
    parsed: argparse.Namespace = bench.build_parser().parse_args(list(given))
    return parsed


def test_levels_are_all_pass_none_pass_or_in_between(bench: ModuleType) -> None:
    assert bench.level(1.0, 0.9) == bench.level(0.9, 0.9) == "easy"
    assert bench.level(0.0, 0.9) == "hard"
    assert bench.level(0.5, 0.9) == "medium"
    assert bench.level(0.85, 0.9) is None  # neither too easy nor medium: left out


def test_the_split_takes_a_third_of_each_level_and_keeps_held_out_problems_apart(
    bench: ModuleType,
) -> None:
    rates = [1.0] * 7 + [0.0] * 9 + [0.5] * 6 + [0.85] * 3
    rows = [{"question": f"{i}+0=", "answer": str(i), "pass_rate": r} for i, r in enumerate(rates)]
    train, evals = bench.split(rows, args(bench, "--rows", "4"))
    for name in bench.LEVELS:
        assert sum(r["level"] == name for r in train) == 4
        assert sum(r["level"] == name for r in evals) == 2
    assert not {r["question"] for r in train} & {r["question"] for r in evals}
    with pytest.raises(SystemExit, match="only 6 medium problems"):
        bench.split(rows, args(bench, "--rows", "5"))


def test_the_held_out_curve_takes_each_evaluated_versions_step_time(
    bench: ModuleType, tmp_path: Path
) -> None:
    metrics = [{"policy_version": v, "wall_time": 2.0 * v} for v in (1, 2, 3, 4)]
    evals = [{"policy_version": v, "eval/reward": r} for v, r in ((0, 0.2), (2, 0.4), (4, 0.5))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    curve = bench.eval_curve(tmp_path)
    assert curve == [(0.0, 0.2), (4.0, 0.4), (8.0, 0.5)]
    assert bench.at_time(curve, 6.0) == pytest.approx(0.45)
    # the mean over [0, 4] of a line from 0.2 to 0.4 is 0.3
    assert bench.mean_until(curve, 4.0) == pytest.approx(0.3)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_smoke_run_ends_with_its_result_line(tmp_path: Path) -> None:
    """Two real two-step runs and the probing: about 4 minutes on a quiet machine, 10 or more
    on a loaded one."""
    command = [sys.executable, "-m", "bench.curriculum", "--smoke", "--arms", "uniform,curriculum"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1400)
    last = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert last.startswith("zero-signal per trained uniform/curriculum ")
