"""bench.curriculum: the mixed-difficulty dataset's levels and split, checkpoints against wall
time, rewards at equal time, and (slow) its smoke run through real `grpo-stream up` runs."""

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


@pytest.fixture
def data(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO))
    return importlib.import_module("bench.curriculum_data")


def args(bench: ModuleType, *given: str) -> argparse.Namespace:
    parsed: argparse.Namespace = bench.build_parser().parse_args(list(given))
    return parsed


def test_levels_are_all_pass_none_pass_or_in_between(data: ModuleType) -> None:
    assert data.level(1.0, 0.9) == data.level(0.9, 0.9) == "easy"
    assert data.level(0.0, 0.9) == "hard"
    assert data.level(0.5, 0.9) == "medium"
    assert data.level(0.85, 0.9) is None  # neither too easy nor medium: left out


def test_the_split_takes_a_third_of_each_level_and_keeps_held_out_problems_apart(
    bench: ModuleType, data: ModuleType
) -> None:
    rates = [1.0] * 7 + [0.0] * 9 + [0.5] * 6 + [0.85] * 3
    rows = [{"question": f"{i}+0=", "answer": str(i), "pass_rate": r} for i, r in enumerate(rates)]
    train, evals = data.split(rows, args(bench, "--rows", "4", "--held", "2"))
    for name in data.LEVELS:
        assert sum(r["level"] == name for r in train) == 4
        assert sum(r["level"] == name for r in evals) == 2
    assert not {r["question"] for r in train} & {r["question"] for r in evals}
    with pytest.raises(SystemExit, match="only 6 medium problems"):
        data.split(rows, args(bench, "--rows", "5", "--held", "2"))


def test_each_checkpoint_takes_the_wall_time_of_its_step(bench: ModuleType, tmp_path: Path) -> None:
    metrics = [{"step": n, "wall_time": 2.0 * n} for n in (1, 2, 3, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    for n in (2, 4):
        (tmp_path / "checkpoints" / f"step-{n}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step-{n}" / "COMPLETE").touch()
    (tmp_path / "checkpoints" / "step-3").mkdir()  # incomplete: not scored
    found = bench.checkpoint_times(tmp_path)
    assert [(t, p.name) for t, p in found] == [(4.0, "step-2"), (8.0, "step-4")]


def test_spread_keeps_points_evenly_in_time_and_the_last(bench: ModuleType) -> None:
    points = [(float(t), Path(str(t))) for t in (1, 2, 3, 4, 5, 9, 10, 11)]
    assert [t for t, _ in bench.spread(points, 3)] == [1.0, 5.0, 11.0]
    assert bench.spread(points[:2], 3) == points[:2]


def test_rewards_at_equal_time_and_until_then_are_linear_between_points(
    bench: ModuleType,
) -> None:
    curve = [(0.0, 0.2), (4.0, 0.4), (8.0, 0.5)]
    assert bench.at_time(curve, 6.0) == pytest.approx(0.45)
    assert bench.mean_until(curve, 4.0) == pytest.approx(0.3)  # a line from 0.2 to 0.4


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_smoke_run_ends_with_its_result_line(tmp_path: Path) -> None:
    """Two real runs of a step or two, their checkpoints scored, and the probing: about 4
    minutes on a quiet machine, 10 or more on a loaded one."""
    command = [sys.executable, "-m", "bench.curriculum", "--smoke", "--arms", "uniform,curriculum"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1400)
    last = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert last.startswith("zero-signal per trained uniform/curriculum ")
