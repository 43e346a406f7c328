"""On-policy distillation end to end: real hub, generator, scorer, teacher and trainer
processes; the teacher is another shipped model with the policy's vocabulary (tiny-calc)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from .conftest import Run, assert_exactly_once, hub_events, killed_after_step_two, metrics

pytestmark = pytest.mark.slow
TEACHER = ("--set", "algo.distill.teacher=grpo-stream/tiny-calc")


def test_a_distillation_run_trains_every_group_once_with_its_teachers_kl(
    tmp_path: Path, background_run: list[Run]
) -> None:
    steps = 6
    run = Run(tmp_path / "run", steps, *TEACHER, "--set", "algo.distill.weight=0.5")
    background_run.append(run)
    assert run.finish() == 0, run.output()[-3000:]
    rows = metrics(run.run_dir)
    assert len(rows) == steps
    kls = [r["distill_kl"] for r in rows]
    assert all(k is not None and math.isfinite(k) and k > 0 for k in kls), kls
    assert_exactly_once(run.run_dir, steps)
    assert not [e for e in hub_events(run.run_dir, "hub.refused") if e["code"] == "bad_taught"]


def test_a_killed_teacher_is_restarted_and_its_groups_taught_once(
    tmp_path: Path, background_run: list[Run]
) -> None:
    steps = 14
    paced = ["--set", "run.restarts=2", "--set", "trainer.throttle_s=0.3"]
    run = Run(tmp_path / "run", steps, *TEACHER, *paced, "--set", "teacher.timeout_s=5")
    background_run.append(run)
    joins = killed_after_step_two(run, "teacher-0")
    assert_exactly_once(run.run_dir, steps)
    assert len(joins) >= 2  # the restarted teacher joined again and got work
