"""A real Slurm cluster for tests: slurmctld on this host, one slurmd per node namespace.

Slurm 22.05 from the distribution (`apt-get install slurm-wlm munge`), verified on this kind
of machine in shared/notes/slurm-and-ray-here.md: munge authenticates (one munged on this
host serves every namespace through its socket path); slurmd runs under `nsenter --net`
(`ip netns exec` remounts /sys and slurmd then fails); proctrack/linuxproc (no cgroups here).
Nothing is written to /etc/slurm: every daemon and command reads SLURM_CONF.

The nodes are cl-n1..cl-n3 (10.201.0.11-13). Each has its own /var/tmp (node-local disk) and
sees the submit directory as an empty mount, so a job gets its config and secrets only
through Slurm (netns.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .netns import HOST_ADDR, Node, kill_pids, nodes

SCRIPT = Path(__file__).parents[3] / "deploy" / "slurm" / "grpo-stream.sbatch"
NODES = {"cl-n1": "10.201.0.11", "cl-n2": "10.201.0.12", "cl-n3": "10.201.0.13"}
SLURMD_PORT = 6818  # each slurmd listens in its own namespace: no clash on this host
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
NEEDED = ("slurmctld", "slurmd", "sbatch", "scontrol", "munge", "munged", "nsenter", "unshare")


def missing_tools() -> list[str]:
    return [tool for tool in NEEDED if shutil.which(tool) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        port: int = s.getsockname()[1]
        return port


def _conf(root: Path, ctl_port: int) -> str:
    state = root / "state"
    spool = root / "spool"
    logs = root / "log"
    for d in (state, spool, logs):
        d.mkdir(parents=True, exist_ok=True)
    lines = [
        "ClusterName=cltest",
        f"SlurmctldHost=localhost({HOST_ADDR})",
        f"SlurmctldPort={ctl_port}",
        f"SlurmdPort={SLURMD_PORT}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1",
        "ReturnToService=2",
        f"StateSaveLocation={state}",
        f"SlurmdSpoolDir={spool}/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={logs}/slurmctld.log",
        f"SlurmdLogFile={logs}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "KillWait=10",
        "MailProg=/bin/true",
        "AuthInfo=cred_expire=10",  # a requeued job waits this long (default 120 s)
        "DefMemPerCPU=1000",
        "MaxJobCount=100",
    ]
    for name, addr in NODES.items():
        lines.append(
            f"NodeName={name} NodeHostname={name} NodeAddr={addr} CPUs=2 RealMemory=6000 "
            "State=UNKNOWN"
        )
    lines.append(f"PartitionName=cl Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


@dataclass
class Slurm:
    """The running cluster and the commands a user would type on the submit host."""

    root: Path
    submit: Path
    """The submit directory: this host's files, hidden from every node."""
    conf: Path
    nodes: list[Node]
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """The submitting shell's environment (sbatch exports it to the job)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SBATCH"))}
        return {**base, "SLURM_CONF": str(self.conf)}

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def run(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> str:
        out = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, cwd=self.submit,
            env={**self.env, **(env or {})},
        )  # fmt: skip
        if out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr}")
        return out.stdout

    def sbatch(self, *argv: str, env: dict[str, str] | None = None) -> int:
        return int(self.run("sbatch", "--parsable", *argv, env=env).strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job` as a dict ({} once the controller forgot the job)."""
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True,
            timeout=30, env=self.env,
        ).stdout  # fmt: skip
        fields: dict[str, str] = {}
        for item in out.split():
            key, sep, value = item.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def wait_state(self, job_id: int, states: set[str], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job(job_id).get("JobState", "")
            if state in states:
                return state
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} is {state!r}, not in {states} after {timeout}s")

    def requeue(self, job_id: int, timeout: float = 60) -> None:
        """`scontrol requeue`, then start it at once (else it waits cred_expire, 10 s here)."""
        self.run("scontrol", "requeue", str(job_id))
        self.wait_state(job_id, {"PENDING"}, timeout)
        self.run("scontrol", "update", f"jobid={job_id}", "StartTime=now")

    def wait_idle(self, timeout: float = 30) -> None:
        """Every node idle (no job step left anywhere)."""
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t")
            states = [line.split()[1] for line in out.splitlines() if line.split()]
            if len(states) == len(NODES) and all(s == "idle" for s in states):
                return
            time.sleep(0.2)
        raise AssertionError(f"nodes not idle after {timeout}s: {out}")

    def slurmd_pid(self, node: Node) -> int:
        return self.daemons[node.name].pid

    def log(self, name: str) -> str:
        path = self.root / "log" / f"{name}.log"
        return path.read_text()[-3000:] if path.exists() else ""


def _munge() -> subprocess.Popen[bytes] | None:
    """A munged for this host: the running one, else one started here (returned, to stop)."""
    if _munge_works():
        return None
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    proc = subprocess.Popen(
        ["runuser", "-u", "munge", "--", "munged", "--foreground"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while not _munge_works():
        if time.monotonic() > deadline or proc.poll() is not None:
            kill_pids([proc.pid])
            pytest.skip("munged does not start here (is /etc/munge/munge.key there?)")
        time.sleep(0.1)
    return proc


def _munge_works() -> bool:
    if not MUNGE_SOCKET.exists():
        return False
    cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
    if cred.returncode != 0:
        return False
    check = subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=10)
    return check.returncode == 0


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )


@contextmanager
def slurm_cluster(root: Path) -> Iterator[Slurm]:
    """slurmctld and three slurmd nodes, all idle; every daemon, step and namespace removed
    after (also when the test fails)."""
    missing = missing_tools()
    if missing:
        pytest.skip(
            f"Slurm is not installed ({', '.join(missing)}): apt-get install slurm-wlm munge"
        )
    if os.geteuid() != 0:
        pytest.skip("the Slurm fixture needs root (namespaces, slurmd)")
    submit = root / "submit"
    submit.mkdir(parents=True)
    state = root / "slurm"
    state.mkdir()
    conf = state / "slurm.conf"
    conf.write_text(_conf(state, _free_port()))
    munged = _munge()
    with nodes(root, NODES) as made:
        slurm = Slurm(state, submit, conf, made)
        env = slurm.env
        try:
            slurm.daemons["slurmctld"] = _start(
                ["slurmctld", "-D", "-i", "-f", str(conf)], state / "slurmctld.out", env
            )
            for node in made:
                argv = node.command(["slurmd", "-D", "-N", node.name, "-f", str(conf)],
                                    hidden=(submit,))  # fmt: skip
                slurm.daemons[node.name] = _start(argv, state / f"{node.name}.out", env)
            try:
                slurm.wait_idle()
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{slurm.log('slurmctld')}") from None
            yield slurm
        finally:
            _stop(slurm)
            if munged is not None:
                kill_pids([munged.pid])


def _stop(slurm: Slurm) -> None:
    """Cancel every job, stop the daemons by pid (nodes first, then the controller)."""
    subprocess.run(["scancel", "--partition=cl"], env=slurm.env, capture_output=True, timeout=30)
    for name, proc in slurm.daemons.items():
        if name != "slurmctld":
            kill_pids([proc.pid], grace_s=10)
    if "slurmctld" in slurm.daemons:
        kill_pids([slurm.daemons["slurmctld"].pid], grace_s=10)
    for proc in slurm.daemons.values():
        proc.wait(timeout=30)


def submit_script(slurm: Slurm, name: str, config: str, **params: str) -> int:
    """deploy/slurm/grpo-stream.sbatch as a user submits it on the three nodes (no GPUs
    here) with `params` in its environment: the config in CONFIG_TOML, RUN_DIR /var/tmp/NAME
    on each node's own disk, the job's output in /var/tmp/NAME-JOBID.out on cl-n1. The job id."""
    bin_dir = Path(sys.executable).parent
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CONFIG_TOML": config,
        "RUN_DIR": f"/var/tmp/{name}",
        "GRPO_STREAM": str(bin_dir / "grpo-stream"),
        "GENERATORS_PER_NODE": "1",
        "SCORERS": "1",
        **params,
    }
    output = f"--output=/var/tmp/{name}-%j.out"
    return slurm.sbatch("--nodes=3", "--gpus-per-node=0", output, str(SCRIPT), env=env)
