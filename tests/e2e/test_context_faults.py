"""A context-parallel trainer (two ranks splitting every sequence) whose second rank is
killed in the middle of a step: the step fails, `up` restarts the trainer, which resumes
from its checkpoint like any trainer rank, and the run completes with every group trained
once."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import time
from collections import deque
from pathlib import Path

import pytest

from .conftest import Run, assert_accounting, assert_exactly_once, hub_events, metrics

pytestmark = pytest.mark.slow  # two trainer starts of two torchrun ranks: minutes
STEPS = 20
CONTEXT = ("--set", "trainer.ranks=2", "--set", "trainer.context_parallel=2")
PATIENT = (
    "--set",
    "transport.heartbeat_interval_s=1.0",
    "--set",
    "transport.heartbeat_timeout_s=20",
)
"""Two trainer ranks loading on a small shared CPU must not look lost (after FAST's 3 s)."""
PACED = ("--set", "trainer.throttle_s=0.5")
"""At least 0.5 s a step: the run must not end before the kill."""


def _rank_pid(ancestor: int, rank: int) -> int:
    """The pid of trainer rank `rank`: the first of `ancestor`'s descendants, breadth
    first, whose environment says RANK=rank (torchrun's workers), read from /proc (a status
    query to a hub on a loaded machine can take longer than the run)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # a process gone meanwhile
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    todo = deque(children.get(ancestor, []))
    while todo:
        pid = todo.popleft()
        with contextlib.suppress(OSError):
            if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return pid
        todo.extend(children.get(pid, []))
    raise AssertionError(f"no trainer rank {rank} under pid {ancestor}")


def _trained(run_dir: Path, instance: str, step: int) -> bool:
    path = run_dir / "logs" / f"trainer-{instance}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return any(r["event"] == "batch.trained" and r["step"] == step for r in rows)


def _stop_in_a_step(run_dir: Path, pid: int) -> int:
    """SIGSTOP rank 1 right after the hub sent a step, at a step that rank 0 then cannot
    finish (it waits for rank 1 in the group's collectives); the step."""
    for _ in range(10):
        sent = len(hub_events(run_dir, "batch.sent"))
        deadline = time.monotonic() + 120
        while len(hub_events(run_dir, "batch.sent")) == sent:
            assert time.monotonic() < deadline, "no step sent within 120 s"
            time.sleep(0.01)
        step = int(hub_events(run_dir, "batch.sent")[-1]["step"])
        os.kill(pid, signal.SIGSTOP)
        time.sleep(2.0)
        if not _trained(run_dir, "trainer-0-r0", step):
            return step
        os.kill(pid, signal.SIGCONT)  # it had finished the step already: try the next
    raise AssertionError("rank 1 was never stopped inside a step")


@pytest.mark.timeout(1500)  # two starts of two ranks: 3 minutes quiet, 10 on a loaded machine
def test_a_context_rank_killed_mid_step_fails_the_step_and_the_trainer_resumes(
    tmp_path: Path, background_run: list[Run]
) -> None:
    sets = ("--set", "run.restarts=2", "--set", "trainer.checkpoint_every=2", *PATIENT, *PACED)
    run = Run(tmp_path / "run", STEPS, *CONTEXT, *sets)
    background_run.append(run)
    run.wait_steps(3, timeout=600)
    pid = _rank_pid(run.proc.pid, 1)
    step = _stop_in_a_step(run.run_dir, pid)
    os.kill(pid, signal.SIGKILL)
    assert run.finish(timeout=600) == 0, run.output()[-3000:]
    rows = metrics(run.run_dir)
    assert rows[-1]["step"] == STEPS
    versions = [r["policy_version"] for r in rows]
    assert all(a < b for a, b in itertools.pairwise(versions)), versions  # unique forever
    log = (run.run_dir / "logs" / "trainer-trainer-0-r0.jsonl").read_text()
    assert log.count('"event": "trainer.device"') == 2  # the trainer started again
    assert _trained(run.run_dir, "trainer-0-r0", step)  # the failed step, trained on resume
    assert_accounting(run.run_dir, STEPS)
    assert_exactly_once(run.run_dir, STEPS)
