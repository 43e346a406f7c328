"""`grpo-stream up --launcher ray --address HEAD` on a real Ray cluster: the head on this host,
a worker node in the namespace cl-r1 that cannot see the driver's run directory
(raycluster.py).

- A run: hub and trainer on the head (the driver's node), generator and scorer actors on
  cl-r1; the generator's process is killed mid-run, Ray's restart policy starts its actor
  again, it rejoins and the run completes with every step; the logs of the worker's services
  reach `up`'s console; the secret and the keys reached cl-r1 through Ray, not a file.
- Ctrl-C: `up` stops, and no service process or actor of the run is left anywhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..conftest import SMALL, assert_exactly_once, metrics
from .conftest import events
from .netns import cluster_lock
from .raycluster import RayCluster, ray_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
STEPS = 30


@pytest.fixture(scope="module")
def ray_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    with cluster_lock(), ray_cluster(tmp_path_factory.mktemp("ray")) as cluster:
        yield cluster


def _up(cluster: RayCluster, run_dir: Path, steps: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "grpo_stream.cli.main", "up", "--launcher", "ray",
           "--address", cluster.address, "--run-dir", str(run_dir), "--max-steps", str(steps),
           "--verbose", "--set", "run.restarts=2", *SMALL]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=cluster.env,
                                start_new_session=True)  # fmt: skip


def _wait_steps(run_dir: Path, n: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 240
    while len(metrics(run_dir)) < n:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {n} steps (rc {proc.poll()}):\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


def _generator_pid(cluster: RayCluster, timeout: float = 60) -> int:
    """The generator service's pid on the worker node."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in cluster.workers[0].pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if " run generator " in cmd:
                return pid
        time.sleep(0.2)
    raise AssertionError("no generator process on the worker node")


@dataclass
class Finished:
    run_dir: Path
    rc: int
    console: str
    killed: int


@pytest.fixture(scope="module")
def finished(ray_nodes: RayCluster) -> Finished:
    run_dir = ray_nodes.driver_dir / "run"
    log = ray_nodes.driver_dir / "up.log"
    proc = _up(ray_nodes, run_dir, STEPS, log)
    try:
        _wait_steps(run_dir, 5, proc, log)
        killed = _generator_pid(ray_nodes)
        os.kill(killed, signal.SIGKILL)
        rc = proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Finished(run_dir, rc, log.read_text(), killed)


def test_run_completes_every_step(finished: Finished) -> None:
    assert finished.rc == 0, finished.console[-4000:]
    assert [r["step"] for r in metrics(finished.run_dir)] == list(range(1, STEPS + 1))
    assert (finished.run_dir / "checkpoints" / f"step-{STEPS}" / "COMPLETE").exists()
    assert_exactly_once(finished.run_dir, STEPS)


def test_services_run_as_actors_on_their_nodes(finished: Finished) -> None:
    joined = {(e["service"], e["host"]) for e in events(finished.run_dir, "grouper",
                                                        "peer.joined")}  # fmt: skip
    head = os.uname().nodename
    assert joined == {("trainer", head), ("generator", "cl-r1"), ("scorer", "cl-r1")}


def test_a_killed_generator_is_restarted_by_ray_and_rejoins(finished: Finished) -> None:
    joins = [e for e in events(finished.run_dir, "grouper", "peer.joined")
             if e["service"] == "generator"]  # fmt: skip
    assert [e["joined"] for e in joins] == [1, 2], joins
    assert "restarted by Ray (1 of 2)" in finished.console


def test_the_workers_logs_reach_the_console(finished: Finished) -> None:
    # the generator runs on cl-r1 only (above): its events on `up`'s console came through Ray
    shown = [x for x in finished.console.splitlines() if x.startswith("generator-0 ")]
    assert any("generator.ready" in x for x in shown), finished.console[-3000:]


def test_the_worker_never_saw_the_drivers_files(finished: Finished) -> None:
    # the generator logs to RUN_DIR/logs on its own node: not in the driver's run directory
    assert not list((finished.run_dir / "logs").glob("generator-*.jsonl"))
    assert not list((finished.run_dir / "private").glob("generator-*"))


def test_ctrl_c_leaves_nothing_running(ray_nodes: RayCluster, finished: Finished) -> None:
    run_dir = ray_nodes.driver_dir / "interrupted"
    log = ray_nodes.driver_dir / "interrupted.log"
    proc = _up(ray_nodes, run_dir, 10_000, log)
    try:
        _wait_steps(run_dir, 3, proc, log)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 130, log.read_text()[-3000:]
    deadline = time.monotonic() + 30
    left = ray_nodes.processes(str(run_dir))
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = ray_nodes.processes(str(run_dir))
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes() for p in left]
    assert not ray_nodes.processes("RayServiceProcess")
