"""The harness of the Slurm tests: deploy/slurm/grpo-stream.sbatch run by bash with Slurm
replaced at its boundary (the stand-ins in slurm_stubs/), one scenario per `Job`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_stream.transport.curve import init_keys

STUBS = Path(__file__).parent / "slurm_stubs"


@dataclass
class SlurmRun:
    rc: int
    records: list[dict[str, Any]]
    stderr: str

    def starts(self, service: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["event"] == "start" and r["service"] == service]

    def events(self, event: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["event"] == event]


def stubs(root: Path) -> Path:
    """The stand-ins as executables in root/bin (the Python ones run by this interpreter)."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    stubs = (
        ("srun", "srun.py", f"#!{sys.executable} -S"),
        ("torchrun", "torchrun.py", f"#!{sys.executable} -S"),
        ("grpo-stream", "grpo_stream.py", f"#!{sys.executable} -S"),
        ("scontrol", "scontrol.sh", "#!/bin/bash"),
    )
    for name, source, shebang in stubs:
        (bin_dir / name).write_text(f"{shebang}\n{(STUBS / source).read_text()}")
        (bin_dir / name).chmod(0o755)
    return bin_dir


@dataclass
class Job:
    """One scenario: the script as sbatch would run it on `nodes` (`expect` services start)."""

    nodes: list[str]
    expect: int
    env: dict[str, str]
    sigterm_when_started: bool = False


JOBS = {
    # node1 + two generator nodes with 2 generators each, 2 scorers; the trainer exits 7.
    "three": Job(
        ["node1", "node2", "node3"],
        8,
        {
            "GENERATORS_PER_NODE": "2",
            "SCORERS": "2",
            "HUB_PORT": "6000",
            "TRAINER_PORT": "6001",
            "STUB_EXITS": "trainer=7@0",
        },
    ),
    # trainer ranks on two nodes x 2 GPUs (torchrun multi-node), generators on the third.
    "ranks": Job(
        ["node1", "node2", "node3"],
        6,
        {
            "TRAINER_NODES": "2",
            "TRAINER_GPUS": "2",
            "GENERATORS_PER_NODE": "2",
            "STUB_EXITS": "trainer=0@0",
        },
    ),
    # one node with CURVE keys; the trainer completes.
    "one": Job(
        ["solo"],
        6,
        {
            "GENERATORS_PER_NODE": "3",
            "SCORERS": "1",
            "KEYS_DIR": "keys",
            "STUB_EXITS": "trainer=0@0",
        },
    ),
    # the hub dies and the trainer goes on running.
    "hub_exit": Job(
        ["node1", "node2"],
        4,
        {"GENERATORS_PER_NODE": "1", "STUB_EXITS": "grouper=1@0", "LOST_GRACE_S": "0"},
    ),
    # the end of a run: the trainer tells the hub it is done, the hub stops first.
    "done": Job(
        ["node1", "node2"],
        4,
        {"GENERATORS_PER_NODE": "1", "STUB_EXITS": "grouper=0@0,trainer=0@0.3"},
    ),
    # the config as text in the job's environment, scorers on the third node, CURVE keys made
    # by the job itself.
    "scorer_node": Job(
        ["node1", "node2", "node3"],
        4,
        {
            "CONFIG": "",
            "CONFIG_TOML": "[run]\nmax_steps = 5",  # as $(cat run.toml) gives it
            "SCORER_NODE": "3",
            "GENERATORS_PER_NODE": "1",
            "CURVE": "1",
            "STUB_EXITS": "trainer=0@0",
        },
    ),
    # the script is told to stop (scancel --batch --signal=TERM, or --signal=B:TERM@...).
    "sigterm": Job(["node1", "node2"], 4, {"GENERATORS_PER_NODE": "1", "SCORERS": "1"}, True),
}


def start(script: Path, root: Path, job: Job) -> tuple[subprocess.Popen[str], Path]:
    root.mkdir(parents=True)
    (root / "run.toml").write_text("[run]\nmax_steps = 3\n")
    init_keys(root / "keys")
    record = root / "record.jsonl"
    record.touch()
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env = {
        **base,
        "PATH": f"{stubs(root)}:{base['PATH']}",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": ",".join(job.nodes),
        "CONFIG": "run.toml",
        "RUN_DIR": "run",
        "POLL_S": "0.05",
        "STOP_TIMEOUT_S": "10",
        "LOST_GRACE_S": "10",
        "SCORERS": "1",
        "STUB_RECORD": str(record),
        "STUB_EXPECT": str(job.expect),
        **job.env,
    }
    proc = subprocess.Popen(
        ["bash", str(script)], cwd=root, env=env, stderr=subprocess.PIPE, text=True
    )
    return proc, record


def finish(proc: subprocess.Popen[str], record: Path, job: Job) -> SlurmRun:
    if job.sigterm_when_started:
        deadline = time.monotonic() + 10
        while len(record.read_text().splitlines()) < job.expect and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
    try:
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    records = [json.loads(line) for line in record.read_text().splitlines()]
    return SlurmRun(proc.returncode, records, stderr)


def run_jobs(script: Path, root: Path) -> dict[str, SlurmRun]:
    """Every scenario in JOBS, run side by side (each is mostly waiting)."""
    started = {name: start(script, root / name, job) for name, job in JOBS.items()}
    return {name: finish(*started[name], JOBS[name]) for name in JOBS}
