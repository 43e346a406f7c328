"""`up --resume` continues the run it names: a run stopped with Ctrl-C and resumed with the
command its stop line prints trains to its own max_steps with its own settings."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from grpo_stream.training.metrics import read_metrics

from .conftest import Run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # two short runs

STEPS = 8


def test_a_stopped_run_resumed_as_its_stop_line_says_ends_at_its_own_max_steps(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    first = Run(run_dir, STEPS, "--set", "trainer.lr=5e-5", "--set", "trainer.throttle_s=0.5")
    try:
        first.wait_steps(2, timeout=420)  # start-up is slow on a loaded machine
        first.proc.send_signal(signal.SIGINT)
        assert first.finish(timeout=120) == 130
    finally:
        first.kill()
    output = Path(first.log.name).read_text()
    hint = re.search(r"to continue: (grpo-stream up .*)$", output, re.MULTILINE)
    assert hint is not None, output[-2000:]
    argv = shlex.split(hint.group(1))
    resumed = subprocess.run(
        [sys.executable, "-m", "grpo_stream.cli.main", *argv[1:]],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_metrics(run_dir)[-1]["step"] == STEPS  # not the default run.max_steps (200)
    saved = tomllib.loads((run_dir / "config.toml").read_text())
    assert saved["trainer"]["lr"] == 5e-5 and saved["hub"]["groups_per_step"] == 4
