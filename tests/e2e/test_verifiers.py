"""A verifiers MultiTurn-style environment (tests/unit/envs/vf_guess.py: its own taskset,
task rewards and run() loop) trained end to end by `grpo-stream up`: real hub, generator,
sandboxed env workers and trainer processes, the tiny-guess model."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from grpo_stream.config.envs import ADAPTER_ENV
from grpo_stream.training.metrics import read_metrics

from .conftest import SMALL, changed_parameters, up_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # verifiers imports: +1 min loaded

STEPS = 2
ENVS = Path(__file__).parents[1] / "unit" / "envs"
SETTINGS = [
    "--set", 'task.name="verifiers:vf_guess:load_environment"',
    "--set", f'env.name="{ADAPTER_ENV}"',
    "--set", 'model.name_or_path="grpo-stream/tiny-guess"',
    "--set", "generator.max_tokens=3",
    "--set", "env.max_turns=4",
    "--set", "env.max_episode_tokens=64",
    "--set", "env.timeout_s=30",
    "--set", "trainer.checkpoint_every=2",
]  # fmt: skip


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("vf") / "run"
    path = os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        up_command(run_dir, STEPS, *SETTINGS, settings=SMALL),
        capture_output=True, text=True, timeout=540, env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_steps_train_on_episode_rewards_and_the_ledger_balances(finished_run: Path) -> None:
    rows = read_metrics(finished_run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in rows)  # the task's rewards, not NaN
    counters = json.loads((finished_run / "hub" / "counters.json").read_text())
    done = sum(counters[k] for k in ("trained", "filtered", "stale", "failed"))
    assert counters["dispatched"] == done + counters["in_progress"]
    assert counters["failed"] == 0
    assert not list((finished_run / "logs").glob("scorer-*"))  # episodes start no scorer


def test_parameters_changed(finished_run: Path) -> None:
    ckpt = finished_run / "checkpoints" / f"step-{STEPS}"
    assert changed_parameters(ckpt, "grpo-stream/tiny-guess")
