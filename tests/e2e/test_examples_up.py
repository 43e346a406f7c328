"""examples/own.toml runs as docs/guide/your-own.md says: the user's data file and reward
module, found through PYTHONPATH, on the shipped tiny model."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .conftest import metrics, up_command

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_own_example_trains_with_its_data_and_reward(tmp_path: Path) -> None:
    path = os.pathsep.join([str(ROOT / "examples" / "own"), os.environ.get("PYTHONPATH", "")])
    run_dir = tmp_path / "own"
    cmd = up_command(
        run_dir, 3, "--config", "examples/own.toml", "--set", "eval.every=0"
    )  # eval every 20 steps would start an evaluator that 3 steps never use
    result = subprocess.run(
        cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": path},
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = metrics(run_dir)
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(0.0 <= row["reward_mean"] <= 1.0 for row in rows)
    assert '"my_rewards:near"' in (run_dir / "config.toml").read_text()  # the reward it ran
    # the guide's "start where another run ended": its checkpoint is a model directory
    checkpoint = run_dir / "checkpoints" / "step-3"
    check = subprocess.run(
        [*up_command(tmp_path / "next", 3), "--check",
         "--set", f"model.name_or_path={json.dumps(str(checkpoint))}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"model: {checkpoint}" in check.stdout
    assert "fit: longest prompt" in check.stdout
