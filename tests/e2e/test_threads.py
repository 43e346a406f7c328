"""`up` with run.torch_threads = "auto": the plan reaches the real trainer and generator."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .conftest import SMALL, up_command

pytestmark = pytest.mark.slow


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core for each service")
def test_auto_splits_the_cores_between_trainer_and_generator(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = up_command(run_dir, 2, "--set", 'run.torch_threads="auto"', settings=SMALL)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = {}
    for path in (run_dir / "logs").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("event") == "service.threads":
                seen[event["service"]] = event
    assert set(seen) == {"trainer", "generator"}  # the hub and scorer run no torch
    cores = sorted(os.sched_getaffinity(0))
    trainer, generator = seen["trainer"], seen["generator"]
    assert trainer["threads"] + generator["threads"] == len(cores)
    if trainer["threads"] == generator["threads"] == 1:
        # one thread each is left unpinned: both may run on every core the run has
        assert trainer["cpus"] == generator["cpus"] == cores
    else:  # a service with a pool is pinned to cores of its own
        assert not set(trainer["cpus"]) & set(generator["cpus"])
        assert len(trainer["cpus"]) == trainer["threads"]
