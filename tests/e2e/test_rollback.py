"""A NaN loss in a live run (trainer.fault_nan_step): the trainer rolls back, lowers the
learning rate by rollback.lr_factor, and training goes on to max_steps with every step
recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import Run, assert_accounting, metrics

pytestmark = pytest.mark.slow
STEPS = 5
NAN_STEP = 2  # trainer.step when the NaN is injected: the batch that would become step 3


def trainer_events(run_dir: Path, event: str) -> list[dict[str, Any]]:
    rows = []
    for path in (run_dir / "logs").glob("trainer-*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("event") == event:
                rows.append(row)
    return rows


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("rollback") / "run"
    run = Run(run_dir, STEPS, "--set", f"trainer.fault_nan_step={NAN_STEP}")
    try:
        assert run.finish() == 0, Path(run.log.name).read_text()[-3000:]
    finally:
        run.kill()
    return run_dir


def test_nan_loss_logs_one_rollback_with_its_step_and_cause(nan_run: Path) -> None:
    events = trainer_events(nan_run, "grpo.rollback")
    assert len(events) == 1, events
    assert events[0]["step"] == NAN_STEP
    assert events[0]["cause"] == "non_finite_loss"


def test_every_step_is_recorded_after_the_rollback(nan_run: Path) -> None:
    rows = metrics(nan_run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["policy_version"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["loss"] is not None for r in rows)  # no NaN reached the metrics


def test_rollback_count_appears_in_rows_after_it(nan_run: Path) -> None:
    rows = metrics(nan_run)
    assert [r["rollbacks"] for r in rows] == [0] * NAN_STEP + [1] * (STEPS - NAN_STEP)


def test_learning_rate_is_reduced_by_the_rollback_factor(nan_run: Path) -> None:
    from grpo_stream.config import RunConfig

    factor = RunConfig().algo.rollback.lr_factor
    rows = metrics(nan_run)
    before, after = rows[NAN_STEP - 1]["lr"], rows[NAN_STEP]["lr"]
    assert after == pytest.approx(before * factor, rel=1e-6)
    assert trainer_events(nan_run, "grpo.rollback")[0]["lr"] == [pytest.approx(after, rel=1e-6)]


def test_groups_are_accounted_for_across_the_rollback(nan_run: Path) -> None:
    assert_accounting(nan_run, STEPS)
