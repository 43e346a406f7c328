"""Time from launch to the first trainer step: `grpo-stream up` on this machine, the Slurm
template (`sbatch deploy/slurm/grpo-stream.sbatch`) on a real Slurm, `up --launcher ray` on a
running Ray cluster. Goal: Slurm and Ray within 1.2x of local.

    python -m bench.launch_to_step [--repeats 3] [--launchers local,slurm,ray] [--smoke]

Every run trains the same tiny run (hub, trainer, one generator, one scorer; 4 groups of 4
per step) on this machine's cores: local as processes; Slurm and Ray on the test clusters of
tests/e2e/clusters (Slurm: slurmctld and three slurmd in network namespaces; Ray: a head here
and a worker in a namespace), started before timing, as a user's cluster would be running.
The clock starts just before the launch command and stops when the trainer's first step is
in metrics.jsonl (polled every 20 ms); launchers alternate within each repeat. Needs root
(namespaces), Slurm and munge from apt, and the `ray` extra; launchers whose cluster cannot
start here are reported as skipped.

--smoke: builds each launcher's command and runs the local pre-flight (`up --check`), starts
nothing; finishes in seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, RESULTS_DIR
from tests.e2e.conftest import SMALL
from tests.e2e.conftest import up_command as e2e_up_command

CONFIG = (
    "[run]\nmax_steps = 2\n[hub]\ngroups_per_step = 4\n[generator]\ngroup_size = 4\n"
    "prompts_per_request = 4\n"
)
LAUNCHERS = ("local", "slurm", "ray")
POLL_S = 0.02
TIMEOUT_S = 300.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    parser.add_argument("--smoke", action="store_true", help="build commands; start nothing")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "launch_to_step.json")
    return parser


def up_command(run_dir: Path, *extra: str) -> list[str]:
    """`up` for two steps of the e2e tests' small run (tests/e2e/conftest.py's command)."""
    return e2e_up_command(run_dir, 2, *extra, settings=SMALL)


def first_step(metrics: Path, proc: subprocess.Popen[bytes] | None, started: float) -> float:
    """Seconds from `started` until metrics.jsonl has a row (the trainer's first step)."""
    while time.monotonic() - started < TIMEOUT_S:
        if metrics.exists() and metrics.read_text().strip():
            return time.monotonic() - started
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the launcher exited with {proc.returncode} before step 1")
        time.sleep(POLL_S)
    raise RuntimeError(f"no first step in {TIMEOUT_S:.0f}s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def time_up(run_dir: Path, *extra: str, env: dict[str, str] | None = None) -> float:
    """Launch `up` (local, or `extra` for another launcher) and time its first step."""
    with open(os.devnull, "wb") as null:
        started = time.monotonic()
        proc = subprocess.Popen(
            up_command(run_dir, *extra), stdout=null, stderr=null, env=env, start_new_session=True
        )
    try:
        return first_step(run_dir / "metrics.jsonl", proc, started)
    finally:
        _stop(proc)


@contextlib.contextmanager
def slurm_launcher(root: Path) -> Iterator[Callable[[int], float]]:
    from tests.e2e.clusters.netns import cluster_lock
    from tests.e2e.clusters.slurm import slurm_cluster, submit_script

    with cluster_lock(), slurm_cluster(root / "slurm") as slurm:

        def run(n: int) -> float:
            started = time.monotonic()
            job = submit_script(slurm, f"bench-{n}", CONFIG, SCORER_NODE="3")
            metrics = slurm.node("cl-n1").local / f"bench-{n}" / "metrics.jsonl"
            try:
                return first_step(metrics, None, started)
            finally:
                slurm.run("scancel", str(job))
                slurm.wait_idle(60)

        yield run


@contextlib.contextmanager
def ray_launcher(root: Path) -> Iterator[Callable[[int], float]]:
    from tests.e2e.clusters.netns import cluster_lock
    from tests.e2e.clusters.raycluster import ray_cluster

    with cluster_lock(), ray_cluster(root / "ray") as cluster:
        yield lambda n: time_up(
            cluster.driver_dir / f"run-{n}",
            "--launcher",
            "ray",
            "--address",
            cluster.address,
            env=cluster.env,
        )


def measure(launchers: list[str], repeats: int, root: Path) -> dict[str, list[float]]:
    """Seconds to the first step per launcher; each cluster is up for its launcher's runs."""
    times: dict[str, list[float]] = {name: [] for name in launchers}
    makers = {"slurm": slurm_launcher, "ray": ray_launcher}
    for n in range(repeats):
        for name in launchers:
            if name == "local":
                times[name].append(time_up(root / f"local-{n}"))
                continue
            try:
                with makers[name](root / f"{name}-{n}") as run:
                    times[name].append(run(n))
            except BaseException as exc:  # a cluster that cannot start here is skipped
                if type(exc).__name__ != "Skipped":
                    raise
                print(f"{name}: skipped ({exc})")
    return times


def report(times: dict[str, list[float]], load: list[str]) -> dict[str, Any]:
    local = statistics.median(times["local"]) if times.get("local") else None
    rows = {}
    for name, values in times.items():
        median = statistics.median(values) if values else None
        ratio = median / local if median is not None and local else None
        rows[name] = {"seconds": values, "median_s": median, "vs_local": ratio}
        shown = "-" if median is None else f"{median:6.1f} s"
        print(
            f"{name:6} first step after {shown}  ({'-' if ratio is None else f'{ratio:.2f}x'} "
            f"local)  runs: {', '.join(f'{v:.1f}' for v in values) or '-'}"
        )
    return {
        "launchers": rows,
        "loadavg": load,
        "goal_vs_local": 1.2,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def smoke(launchers: list[str]) -> None:
    """Commands and pre-flight only: every launcher's command builds, local passes --check."""
    with tempfile.TemporaryDirectory() as tmp:
        check = subprocess.run(
            up_command(Path(tmp) / "run", "--check"), capture_output=True, text=True, timeout=120
        )
        if check.returncode != 0:
            raise SystemExit(f"up --check failed: {check.stdout}{check.stderr}")
        for name in launchers:
            extra = ["--launcher", "ray", "--address", "HEAD:PORT"] if name == "ray" else []
            cmd = (
                ["sbatch", "--nodes=3", str(REPO_ROOT / "deploy/slurm/grpo-stream.sbatch")]
                if name == "slurm"
                else up_command(Path(tmp) / "run", *extra)
            )
            print(f"{name:6} {' '.join(cmd[:8])} ...")
    print("smoke: commands built, pre-flight passed; nothing timed")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    launchers = [x for x in args.launchers.split(",") if x]
    unknown = sorted(set(launchers) - set(LAUNCHERS))
    if unknown or "local" not in launchers:
        raise SystemExit(f"--launchers: local and any of {', '.join(LAUNCHERS)} ({unknown})")
    if args.smoke:
        smoke(launchers)
        return
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as tmp:
        load = [Path("/proc/loadavg").read_text().strip()]
        times = measure(launchers, args.repeats, Path(tmp))
        load.append(Path("/proc/loadavg").read_text().strip())
    result = report(times, load)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"load {load[0]} -> {load[-1]}; wrote {args.out}")


if __name__ == "__main__":
    main()
