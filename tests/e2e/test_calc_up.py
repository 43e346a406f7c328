"""`grpo-stream up --task calc` end to end: real services, the sandboxed calc environment,
the shipped tiny-calc model; every episode group ends exactly once and training moves the
weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from grpo_stream.training.metrics import read_metrics

from .conftest import assert_accounting, changed_parameters, finished_up

STEPS = 3
GROUPS = 4  # hub.groups_per_step in SMALL
EPISODES = 4  # generator.group_size in SMALL


@pytest.fixture(scope="module")
def calc_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("calc") / "run"
    return finished_up(run_dir, STEPS, "--task", "calc", timeout=240)


@pytest.mark.slow
def test_every_episode_group_ends_once_and_each_step_trains_whole_groups(calc_run: Path) -> None:
    counters = assert_accounting(calc_run, STEPS, GROUPS)  # and no group trained twice
    assert counters["failed"] == 0 and counters["duplicates_dropped"] == 0
    rows = read_metrics(calc_run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert counters["trained"] == GROUPS * STEPS
    for row in rows:
        assert row["groups_trained"] == GROUPS * row["step"]  # a running total
        assert row["sequences"] == GROUPS * EPISODES  # one trajectory per episode
        assert 0.0 <= row["reward_mean"] <= 1.0 and math.isfinite(row["reward_mean"])


@pytest.mark.slow
def test_calc_training_changes_the_tiny_calc_parameters(calc_run: Path) -> None:
    ckpt = calc_run / "checkpoints" / f"step-{STEPS}"
    assert changed_parameters(ckpt, "grpo-stream/tiny-calc")
