"""Dynamic sampling with refill and a generative judge, end to end: real hub, generator,
scorer and trainer processes on the tiny model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from .conftest import Run, assert_exactly_once, hub_events, metrics

pytestmark = pytest.mark.slow


def test_refill_replaces_zero_signal_groups_and_filter_only_runs_steps_short(
    tmp_path: Path, background_run: list[Run]
) -> None:
    steps = 8
    # G = 2: more than half of the tiny model's groups come back all right or all wrong (a
    # signal rate of 0.2-0.45 measured); a bound of 16 refills a group never binds here
    refill = Run(tmp_path / "refill", steps, "--set", "generator.group_size=2",
                 "--set", "hub.max_refill_ratio=16")  # fmt: skip
    background_run.append(refill)
    assert refill.finish() == 0, refill.output()[-3000:]
    rows = metrics(refill.run_dir)
    assert rows[-1]["groups_refilled"] > 0
    assert all(r["step_groups"] == 4 for r in rows)  # every step full: hub.groups_per_step
    assert_exactly_once(refill.run_dir, steps)
    only = Run(tmp_path / "filter", steps, "--set", "generator.group_size=2",
               "--set", "hub.max_refill_ratio=0")  # fmt: skip
    background_run.append(only)
    assert only.finish() == 0, only.output()[-3000:]
    rows = metrics(only.run_dir)
    assert rows[-1]["groups_refilled"] == 0 and rows[-1]["groups_filtered"] > 0
    assert any(r["step_groups"] < 4 for r in rows)  # short steps: their zero-signal groups
    assert_exactly_once(only.run_dir, steps)


def test_a_judge_scores_a_run_from_its_scorers(tmp_path: Path, background_run: list[Run]) -> None:
    steps = 4
    judge = '[{name = "judge", path = "grpo-stream/tiny-judge", params = {device = "cpu"}}]'
    # every group trained: the tiny judge calls most of the policy's answers right, so most
    # groups have no signal and filtering them would starve the trainer (measured: 1 step
    # in 4 minutes), which is the judge's verdicts, not its service, at work
    run = Run(tmp_path / "run", steps, "--set", f"task.rewards={judge}",
              "--set", "scorer.timeout_s=60",
              "--set", "algo.advantage.filter_zero_signal=false")  # fmt: skip
    background_run.append(run)
    assert run.finish() == 0, run.output()[-3000:]
    rows = metrics(run.run_dir)
    assert len(rows) == steps and all(math.isfinite(r["reward_mean"]) for r in rows)
    assert_exactly_once(run.run_dir, steps)
    assert not hub_events(run.run_dir, "reward.error")  # every verdict parsed
