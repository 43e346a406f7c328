"""A real Ray cluster for tests: the head on this host (10.201.0.1 on the bridge), one worker
node in the namespace cl-r1 (10.201.0.21), with its own disk and no view of the directory
the driver keeps its run in (netns.py). Ray 2.x from PyPI (`pip install "grpo-stream[ray]"`),
verified here in shared/notes/slurm-and-ray-here.md.

Ray's files go to a short temp dir of this test (socket paths must stay under 108 bytes);
every Ray process is ended by pid at teardown: the `ray start --block` processes, then any
process whose command line names that temp dir, then the worker namespace with its processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from .netns import HOST_ADDR, Node, kill_pids, nodes

WORKERS = {"cl-r1": "10.201.0.21"}
OBJECT_STORE_BYTES = 200 * 1024 * 1024  # the default takes 30% of memory per node
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
"""For the head, the worker and every driver: Ray >= 2.5x turns token auth on when it finds
~/.ray/auth_token (which a local `ray.init()` writes); this cluster must not depend on it."""


@dataclass
class RayCluster:
    address: str
    driver_dir: Path
    """Where the driver keeps its runs: hidden from the worker nodes."""
    workers: list[Node]
    temp_dir: Path

    @property
    def env(self) -> dict[str, str]:
        """The environment a driver (`up --launcher ray`) joins this cluster with."""
        return {**os.environ, **RAY_ENV}

    def processes(self, marker: str) -> list[int]:
        """Pids of every process on this machine whose command line contains `marker`."""
        return _pids_naming(marker)


def _pids_naming(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            found.append(int(entry.name))
    return found


def _ray() -> str:
    return str(Path(sys.executable).parent / "ray")


def _alive_nodes(address: str) -> int:
    script = (
        f"import ray, json; ray.init(address={address!r}, logging_level='ERROR', "
        "log_to_driver=False); print(json.dumps(sum(1 for n in ray.nodes() if n['Alive'])))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **RAY_ENV})  # fmt: skip
    return int(json.loads(out.stdout.strip().splitlines()[-1])) if out.returncode == 0 else 0


@contextmanager
def ray_cluster(root: Path) -> Iterator[RayCluster]:
    """The head and one worker, both alive; everything they started removed after."""
    try:
        import ray  # noqa: F401  - the optional extra
    except ImportError:
        pytest.skip('Ray is not installed: pip install "grpo-stream[ray]"')
    if os.geteuid() != 0 or shutil.which("nsenter") is None:
        pytest.skip("the Ray fixture needs root and nsenter (a worker in a namespace)")
    driver_dir = root / "driver"
    driver_dir.mkdir(parents=True)
    temp_dir = Path(tempfile.mkdtemp(prefix="cl-ray-"))
    port = 6390
    common = ["--block", "--disable-usage-stats", "--num-cpus=2",
              f"--object-store-memory={OBJECT_STORE_BYTES}"]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, **RAY_ENV}
    with nodes(root, WORKERS) as made:
        try:
            head = [_ray(), "start", "--head", f"--node-ip-address={HOST_ADDR}",
                    f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp_dir}",
                    *common]  # fmt: skip
            with (root / "ray-head.log").open("ab") as log:
                procs.append(subprocess.Popen(head, stdout=log, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True))  # fmt: skip
            address = f"{HOST_ADDR}:{port}"
            for node in made:
                argv = [_ray(), "start", f"--address={address}",
                        f"--node-ip-address={node.addr}", *common]  # fmt: skip
                with (root / f"ray-{node.name}.log").open("ab") as log:
                    procs.append(subprocess.Popen(
                        node.command(argv, hidden=(driver_dir,)), stdout=log,
                        stderr=subprocess.STDOUT, env=env, start_new_session=True))  # fmt: skip
            deadline = time.monotonic() + 120
            while _alive_nodes(address) < 1 + len(made):
                if time.monotonic() > deadline:
                    logs = "".join(p.read_text()[-1500:] for p in root.glob("ray-*.log"))
                    raise AssertionError(f"the Ray cluster did not come up:\n{logs}")
                time.sleep(1)
            yield RayCluster(address, driver_dir, made, temp_dir)
        finally:
            kill_pids([p.pid for p in procs], grace_s=20)
            kill_pids(_pids_naming(str(temp_dir)), grace_s=10)
    shutil.rmtree(temp_dir, ignore_errors=True)
