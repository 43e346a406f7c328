"""`up` starts every local service with the device environment `up --dry-run` printed.

NVML is replaced at its boundary for the whole process tree (tests/e2e/fake_nvml: an H100
and an A10 on this host); the services still run on the CPU. Each service logs
`devices.assigned` at start and the hub logs the GPUs each peer reports holding.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SMALL, up_command

pytestmark = pytest.mark.slow  # a whole `up` run, about a minute on a loaded machine
FAKE = Path(__file__).parent / "fake_nvml"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE), env.get("PYTHONPATH", "")])
    env["GRPO_STREAM_TEST_NVML"] = "h100-sxm,a10"
    return env


def _dry_run(run_dir: Path) -> dict[str, tuple[str, str]]:
    """instance -> (devices, CUDA_VISIBLE_DEVICES) as the dry run prints them."""
    cmd = [
        sys.executable,
        "-m",
        "grpo_stream.cli.main",
        "up",
        "--dry-run",
        "--run-dir",
        str(run_dir),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120, check=True)
    lines = out.stdout.splitlines()
    found = {}
    for i, line in enumerate(lines):
        head = re.match(r"(\S+)  host=\S+  devices=(\S+)", line)
        visible = re.search(r"CUDA_VISIBLE_DEVICES=(\S*)", lines[i + 1]) if head else None
        if head and visible:
            found[head.group(1)] = (head.group(2), visible.group(1))
    return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, tuple[str, str]], str, Path]:
    run_dir = tmp_path_factory.mktemp("placement") / "run"
    planned = _dry_run(run_dir)
    cmd = up_command(run_dir, 1, settings=SMALL)
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=280)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return planned, result.stdout + result.stderr, run_dir


def test_the_dry_run_puts_the_trainer_on_the_h100_and_the_generator_on_the_a10(runs) -> None:
    planned, _, _ = runs
    assert {k: v[1] for k, v in planned.items()} == {
        "grouper-0": "", "trainer-0": "0", "generator-0": "1", "scorer-0": "",
    }  # fmt: skip


def test_each_service_starts_with_the_cuda_visible_devices_the_dry_run_printed(runs) -> None:
    planned, output, _ = runs
    started = dict(
        re.findall(r"^(\S+)\s+devices\.assigned cuda_visible_devices=(\S*)", output, re.M)
    )
    assert started == {k: v[1] for k, v in planned.items() if k != "grouper-0"}


def test_the_hub_records_the_gpus_each_service_holds(runs) -> None:
    planned, _, run_dir = runs
    joined = {}
    for path in (run_dir / "logs").glob("grouper*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("event") == "peer.joined":
                joined[row["instance"]] = row["devices"]
    assert joined["trainer-0"] == planned["trainer-0"][0]
    assert joined["generator-0"] == planned["generator-0"][0]
    assert joined["scorer-0"] == ""
