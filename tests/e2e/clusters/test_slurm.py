"""deploy/slurm/grpo-stream.sbatch under a real Slurm: slurmctld and three slurmd nodes in
network namespaces (slurm.py), each with its own disk and no view of the submit directory.
The script runs `grpo-stream up --launcher slurm` on cl-n1, which starts every service as an
srun step on its node.

Submitted as a user would (`sbatch --nodes=3 deploy/slurm/grpo-stream.sbatch`, only
`--gpus-per-node=0` added: no GPUs here), with the config in the job's environment:
- the run: hub and trainer on cl-n1, the generator on cl-n2, the scorer on cl-n3; a stranger
  without the secret tries to register; the job is requeued mid-run and resumes from the
  checkpoint on cl-n1 with no group trained twice; reward rises; final checkpoint;
- trainer ranks on cl-n1 and cl-n2 (srun + torchrun rendezvous, gloo), CURVE with per-role
  keys made by the job;
- `scancel` mid-run: every process and port of the job is gone on every node.
"""

from __future__ import annotations

import json
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from grpo_stream.protocols import messages as m

from ..conftest import assert_exactly_once, metrics, trainer_consumed
from .conftest import events, rewards, stranger_hello
from .netns import cluster_lock
from .slurm import SLURMD_PORT, Slurm, slurm_cluster, submit_script

HUB = "tcp://10.201.0.11:5555"
STEPS = 60
CONFIG = """
[run]
max_steps = {steps}
[trainer]
checkpoint_every = {every}
[hub]
checkpoint_every_s = 1.0
"""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass
class Job:
    id: int
    name: str
    slurm: Slurm

    def run_dir(self, node: str = "cl-n1") -> Path:
        """RUN_DIR as `node` keeps it on its own disk."""
        return self.slurm.node(node).local / self.name

    def output(self) -> str:
        """The job's output (`up`'s console: every service's events and last errors)."""
        out = self.slurm.node("cl-n1").local / f"{self.name}-{self.id}.out"
        return out.read_text()[-4000:] if out.exists() else "(no job output)"

    def wait_steps(self, n: int, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while len(metrics(self.run_dir())) < n:
            state = self.slurm.job(self.id).get("JobState", "")
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
                raise AssertionError(f"job {self.id} ended ({state}) early:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {n} steps in {timeout}s:\n{self.output()}")
            time.sleep(0.2)

    def wait_done(self, timeout: float = 400) -> str:
        state = self.slurm.wait_state(self.id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout)
        assert state == "COMPLETED", f"job {self.id}: {state}\n{self.output()}"
        return state


def submit(slurm: Slurm, name: str, config: str, **params: str) -> Job:
    """The script as written, with the config in CONFIG_TOML and RUN_DIR on each node's disk."""
    return Job(submit_script(slurm, name, config, **params), name, slurm)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    with cluster_lock(), slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@dataclass
class Requeued:
    job: Job
    stranger: m.Message
    secret: str
    cmdlines: list[str]
    environs: list[str]


def _service_processes(slurm: Slurm) -> tuple[list[str], list[str]]:
    """Command lines and environments of every process on the nodes (`up`, srun,
    slurmstepd, the services): the secret reaches a service on srun's stdin alone."""
    cmdlines, environs = [], []
    for node in slurm.nodes:
        for pid in node.pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            except OSError:
                continue  # ended meanwhile
            cmdlines.append(cmd)
            environs.append(environ)
    return cmdlines, environs


@pytest.fixture(scope="module")
def requeued(slurm: Slurm) -> Requeued:
    """The 3-node run: a stranger knocks, the job is requeued after step 20, it completes."""
    job = submit(slurm, "run-a", CONFIG.format(steps=STEPS, every=10), SCORER_NODE="3")
    job.wait_steps(3)
    reply = stranger_hello(HUB)
    secret = (job.run_dir() / "secret").read_text().strip()  # `up` made it on cl-n1
    cmdlines, environs = _service_processes(slurm)
    job.wait_steps(20)
    slurm.requeue(job.id)
    job.wait_done()
    return Requeued(job, reply, secret, cmdlines, environs)


def test_services_run_on_their_own_nodes(requeued: Requeued) -> None:
    joined = events(requeued.job.run_dir(), "grouper", "peer.joined")
    assert {(e["service"], e["host"]) for e in joined} == {
        ("trainer", "cl-n1"),
        ("generator", "cl-n2"),
        ("scorer", "cl-n3"),
    }


def test_every_node_keeps_its_own_files(requeued: Requeued) -> None:
    job = requeued.job
    assert (job.run_dir() / "checkpoints" / f"step-{STEPS}" / "COMPLETE").exists()
    for node in ("cl-n2", "cl-n3"):
        assert not (job.run_dir(node) / "checkpoints").exists()
        assert not (job.run_dir(node) / "run.toml").exists()
    assert events(job.run_dir("cl-n2"), "generator", "generator.ready")
    assert events(job.run_dir("cl-n3"), "scorer", "scorer.ready") or list(
        (job.run_dir("cl-n3") / "logs").glob("scorer-*.jsonl")
    )


def test_reward_rises(requeued: Requeued) -> None:
    values = rewards(requeued.job.run_dir())
    first, last = values[:10], values[-10:]
    assert sum(last) / len(last) > sum(first) / len(first) + 0.05, values


def test_requeued_job_resumes_and_trains_no_group_twice(requeued: Requeued) -> None:
    run_dir = requeued.job.run_dir()
    resumed = [e for e in events(run_dir, "grouper", "hub.resumed") if e["dispatched"] > 0]
    assert len(resumed) == 1  # the requeued start resumes; the first has nothing to resume
    assert len(events(run_dir, "trainer", "trainer.resumed")) == 1
    assert_exactly_once(run_dir, STEPS)


def test_a_stranger_without_the_secret_is_refused(requeued: Requeued) -> None:
    assert isinstance(requeued.stranger, m.Error) and requeued.stranger.code == "bad_hello"
    hosts = {e["host"] for e in events(requeued.job.run_dir(), "grouper", "peer.joined")}
    assert "stranger" not in hosts


def test_the_secret_is_on_no_command_line_nor_in_a_services_environment(
    requeued: Requeued,
) -> None:
    assert re.fullmatch(r"[0-9a-f]{64}", requeued.secret)
    assert any("grpo_stream.cli.main run" in c for c in requeued.cmdlines), "no service seen"
    assert not [c for c in requeued.cmdlines if requeued.secret in c]
    assert not [e for e in requeued.environs if requeued.secret in e]


def test_secret_files_are_private_to_their_node(requeued: Requeued) -> None:
    """Each service's copy on its own node; the hub reads `up`'s beside it on cl-n1."""
    found = []
    for node in ("cl-n1", "cl-n2", "cl-n3"):
        for path in (requeued.job.run_dir(node) / "private").glob("*/secret"):
            found.append((node, path.parent.name))
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700, path.parent
    expected = [("cl-n1", "trainer-0"), ("cl-n2", "generator-0"), ("cl-n3", "scorer-0")]
    assert sorted(found) == expected
    assert stat.S_IMODE((requeued.job.run_dir() / "secret").stat().st_mode) == 0o600


# ----- trainer ranks on two nodes, CURVE with per-role keys --------------------------------
RANK_STEPS = 8


@pytest.fixture(scope="module")
def ranks(slurm: Slurm) -> Job:
    """Ranks on cl-n1 and cl-n2 under CURVE, requeued after step 3: rank 1's node has no
    checkpoint, so it resumes from rank 0's over torch.distributed."""
    job = submit(slurm, "run-b", _ranks_config(RANK_STEPS), TRAINER_NODES="2", CURVE="1")
    job.wait_steps(3)
    slurm.requeue(job.id)
    job.wait_done()
    return job


def _ranks_config(steps: int) -> str:
    return (
        f"[run]\nmax_steps = {steps}\n[trainer]\nranks = 2\ncheckpoint_every = 2\n"
        "[hub]\ngroups_per_step = 4\n[generator]\ngroup_size = 4\nprompts_per_request = 4\n"
    )


def test_trainer_ranks_span_two_nodes(ranks: Job) -> None:
    devices = events(ranks.run_dir("cl-n1"), "trainer", "trainer.device")
    assert devices and {d["world"] for d in devices} == {2}
    assert (ranks.run_dir() / "checkpoints" / f"step-{RANK_STEPS}" / "COMPLETE").exists()
    assert not (ranks.run_dir("cl-n2") / "checkpoints").exists()


def test_requeued_ranks_resume_from_rank_zeros_checkpoint_with_no_group_twice(
    ranks: Job,
) -> None:
    """Rank 1's node holds no checkpoint; it resumed at rank 0's step all the same."""
    zero = events(ranks.run_dir("cl-n1"), "trainer", "trainer.resumed")
    one = events(ranks.run_dir("cl-n2"), "trainer", "trainer.resumed")
    assert len(zero) == len(one) == 1, (zero, one)
    assert zero[0]["step"] == one[0]["step"] >= 2
    # each rank logs the groups of its own shard, on its own node
    shards = [trainer_consumed(ranks.run_dir(node)) for node in ("cl-n1", "cl-n2")]
    assert sorted(shards[0]) == sorted(shards[1]) == list(range(RANK_STEPS))
    groups = [g for shard in shards for ids in shard.values() for g in ids]
    assert len(groups) == len(set(groups)), "a group was trained twice"
    counters = json.loads((ranks.run_dir() / "hub" / "counters.json").read_text())
    assert counters["trained"] == len(groups), (counters, len(groups))


def test_each_role_gets_only_its_own_keys(ranks: Job) -> None:
    def secret_keys(node: str, instance: str) -> set[str]:
        keys = ranks.run_dir(node) / "private" / instance / "keys"
        return {p.name for p in keys.rglob("*_secret") if p.is_file()}

    assert secret_keys("cl-n3", "generator-0") == {"generator.key_secret"}
    assert secret_keys("cl-n1", "scorer-0") == {"scorer.key_secret"}
    # rank 1's node, the second trainer node
    assert secret_keys("cl-n2", "trainer-0-n1") == {"server.key_secret", "trainer.key_secret"}
    # the hub reads the job's key set where the script made it, beside `up` on cl-n1
    assert not (ranks.run_dir() / "private" / "grouper-0" / "keys").exists()
    hub_log = events(ranks.run_dir(), "grouper", "curve.authenticator_started")
    assert hub_log, "the hub did not run under CURVE"


# ----- scancel mid-run ----------------------------------------------------------------------
def test_scancel_mid_run_leaves_no_process_or_port_on_any_node(slurm: Slurm) -> None:
    job = submit(slurm, "run-c", _ranks_config(500), TRAINER_NODES="2")
    job.wait_steps(2)
    slurm.run("scancel", str(job.id))
    slurm.wait_state(job.id, {"CANCELLED"}, 60)
    deadline = time.monotonic() + 30
    left: dict[str, tuple[list[int], list[int]]] = {}
    while time.monotonic() < deadline:
        left = {}
        for node in slurm.nodes:
            pids = [p for p in node.pids() if p != slurm.slurmd_pid(node)]
            ports = [p for p in node.listening() if p != SLURMD_PORT]
            if pids or ports:
                left[node.name] = (pids, ports)
        if not left:
            break
        time.sleep(0.2)
    assert not left, left
