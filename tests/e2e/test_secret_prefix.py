"""A multi-host `up --cluster` with a `prefix` host: every service joins with the run's secret
(signed Hello, sealed session), and the secret itself is on no command line and in no output
(services on ssh and slurm hosts get it shipped: tests/unit/launch, tests/e2e/clusters)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
CLUSTER = """
hub_port = {port}
[[hosts]]
name = "a"
address = "127.0.0.1"
services = {{ hub = 1, trainer = 1, scorer = 1 }}
[[hosts]]
name = "b"
address = "127.0.0.1"
launcher = "prefix"
prefix = ["env"]
services = {{ generator = 1 }}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_services_on_a_prefix_host_join_sealed_and_the_secret_shows_nowhere(
    tmp_path: Path,
) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(CLUSTER.format(port=_free_port()))
    run_dir = tmp_path / "run"
    up = [sys.executable, "-m", "grpo_stream.cli.main", "up", "--cluster", str(cluster),
          "--run-dir", str(run_dir), "--max-steps", "3"]  # fmt: skip
    plan = subprocess.run([*up, "--dry-run"], capture_output=True, text=True, timeout=120)
    commands = [line for line in plan.stdout.splitlines() if line.strip().startswith("cmd:")]
    services = [c for c in commands if "run grouper" not in c]
    assert len(services) == 3, plan.stdout
    done = subprocess.run(up, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    joined = {}
    for path in (run_dir / "logs").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("event") == "hub.connected":
                joined[event["instance"]] = event["sealed"]
    assert joined == {"trainer-0": True, "generator-0": True, "scorer-0": True}
    secret = (run_dir / "secret").read_text().strip()
    assert secret not in plan.stdout + done.stdout + done.stderr
