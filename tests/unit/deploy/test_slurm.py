"""The Slurm path: deploy/slurm/grpo-stream.sbatch execs `grpo-stream up --launcher slurm`,
which places the services on the job's nodes and starts each one with srun.

What `up` would start is read from its dry run (slurm_harness.py): in-process through
Typer's CliRunner with NVML replaced by eight recorded H100s per node (the hardware
boundary), or as the script execs it (the script passes its arguments on to `up`, so
`--dry-run` among them starts nothing). Every command line is parsed by the real CLI and
torchrun's own parser. The run that starts real services is the slow test at the end.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from grpo_stream.cli.main import app
from grpo_stream.hardware.recorded import RecordedNvml, load_record

from .slurm_harness import Planned, job_env, read_dry_run, run_script, srun_stand_in

runner = CliRunner()


@pytest.fixture
def h100s(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import pynvml` answers with eight recorded H100s (the hardware boundary)."""
    monkeypatch.setitem(sys.modules, "pynvml", RecordedNvml([load_record("h100-sxm")] * 8))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def planned(tmp_path: Path, nodes: str, *args: str, **params: str) -> dict[str, Planned]:
    """`up --launcher slurm --dry-run` in a job on `nodes` with 8 GPUs each."""
    env = job_env(nodes, SLURM_GPUS_ON_NODE="8", **params)
    argv = ["up", "--launcher", "slurm", "--dry-run", "--run-dir", str(tmp_path / "run"), *args]
    result = runner.invoke(app, argv, env=env)
    assert result.exit_code == 0, result.output
    return read_dry_run(result.stdout)


def _where(services: dict[str, Planned], prefix: str) -> list[tuple[str, str | None]]:
    return sorted((s.host, s.devices) for s in services.values() if s.instance.startswith(prefix))


def test_hub_scorers_and_trainer_run_on_the_first_node(h100s: None, tmp_path: Path) -> None:
    services = planned(tmp_path, "node[1-3]", GENERATORS_PER_NODE="2", SCORERS="2")
    assert _where(services, "grouper") == [("node1", "")]
    assert _where(services, "scorer") == [("node1", "")] * 2
    assert _where(services, "trainer") == [("node1", "0")]


def test_generators_run_on_the_other_nodes_one_gpu_each(h100s: None, tmp_path: Path) -> None:
    services = planned(tmp_path, "node[1-3]", GENERATORS_PER_NODE="2")
    placed = _where(services, "generator")
    assert placed == [("node2", "0"), ("node2", "1"), ("node3", "0"), ("node3", "1")]


def test_each_service_is_one_srun_task_on_its_node_with_its_gpus_after_srun(
    h100s: None, tmp_path: Path
) -> None:
    """slurmstepd sets CUDA_VISIBLE_DEVICES for a step holding GPUs: ours come after it."""
    services = planned(tmp_path, "node[1-2]", GENERATORS_PER_NODE="1")
    generator = services["generator-0"]
    assert generator.srun == ["srun", "--nodes=1", "--ntasks=1", "-w", "node2", "--overlap"]
    after = generator.cmd[len(generator.srun) :]
    assert after[:3] == ["env", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=0"]


def test_every_service_gets_a_unique_instance_name(h100s: None, tmp_path: Path, cli: Any) -> None:
    services = planned(tmp_path, "node[1-3]", GENERATORS_PER_NODE="2", SCORERS="2")
    names = [cli.parse_run(s.service).params["instance"] for s in services.values()]
    assert len(set(names)) == len(names) == 8
    assert names == list(services)


def test_clients_dial_the_hub_at_the_first_nodes_name(
    h100s: None, tmp_path: Path, cli: Any
) -> None:
    services = planned(tmp_path, "node[1-3]", HUB_PORT="6000")
    clients = [s for s in services.values() if s.instance != "grouper-0"]
    assert {cli.parse_run(s.service).params["hub"] for s in clients} == {"tcp://node1:6000"}


def test_only_hub_and_trainer_resume(h100s: None, tmp_path: Path, cli: Any) -> None:
    services = planned(tmp_path, "node[1-3]", "--resume")
    resumed = {s.instance for s in services.values() if cli.parse_run(s.service).params["resume"]}
    assert resumed == {"grouper-0", "trainer-0"}


def test_one_node_runs_generators_beside_the_trainer_from_gpu_one(
    h100s: None, tmp_path: Path
) -> None:
    services = planned(tmp_path, "solo", GENERATORS_PER_NODE="3", SCORERS="1")
    assert _where(services, "generator") == [("solo", "1"), ("solo", "2"), ("solo", "3")]
    assert _where(services, "trainer") == [("solo", "0")]


def test_scorers_run_on_the_scorer_node(h100s: None, tmp_path: Path) -> None:
    services = planned(tmp_path, "node[1-3]", SCORER_NODE="3", GENERATORS_PER_NODE="1")
    assert _where(services, "scorer") == [("node3", "")] * 2
    assert _where(services, "generator") == [("node2", "0")]
    assert _where(services, "trainer") == [("node1", "0")]


def test_trainer_ranks_span_the_first_nodes_two_gpus_each(h100s: None, tmp_path: Path) -> None:
    layout = {"TRAINER_NODES": "2", "TRAINER_GPUS": "2", "GENERATORS_PER_NODE": "2"}
    services = planned(tmp_path, "node[1-3]", **layout)
    assert _where(services, "trainer") == [("node1", "0,1"), ("node2", "0,1")]
    assert _where(services, "generator") == [("node3", "0"), ("node3", "1")]


def test_each_trainer_node_runs_torchrun_with_its_node_rank(
    h100s: None, tmp_path: Path, cli: Any
) -> None:
    from torch.distributed.run import get_args_parser

    services = planned(tmp_path, "node[1-3]", "--resume", TRAINER_NODES="2", TRAINER_GPUS="2")
    parsed = {}
    for s in services.values():
        if s.torchrun is not None:
            args = get_args_parser().parse_args(s.torchrun)  # torchrun's own parser
            parsed[s.host] = (args.nnodes, args.node_rank, args.nproc_per_node, args.master_addr)
            assert args.module and args.training_script == "grpo_stream.cli.main"
            params = cli.parse_run(s.service).params
            assert params["hub"] == "tcp://node1:5555" and params["resume"]
    assert parsed == {"node1": ("2", 0, "2", "node1"), "node2": ("2", 1, "2", "node1")}


def test_a_layout_that_does_not_fit_the_job_fails_with_one_line(tmp_path: Path) -> None:
    env = job_env("node[1-2]", SLURM_GPUS_ON_NODE="4", TRAINER_GPUS="8")
    argv = ["up", "--launcher", "slurm", "--run-dir", str(tmp_path / "run")]
    result = runner.invoke(app, argv, env=env)
    assert result.exit_code == 2
    wanted = "TRAINER_GPUS=8, but the job has 4 GPU(s) per node (SLURM_GPUS_ON_NODE)"
    assert result.stderr.strip() == f"error: {wanted}"
    assert not (tmp_path / "run").exists()


# ----- the batch script -------------------------------------------------------------------
def test_sbatch_passes_bash_syntax_check(sbatch: Path) -> None:
    result = subprocess.run(["bash", "-n", str(sbatch)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_no_config_fails_with_one_line(sbatch: Path, tmp_path: Path) -> None:
    env = job_env("n1", RUN_DIR=str(tmp_path / "run"))
    result = run_script(sbatch, tmp_path, env, timeout=30)
    assert result.returncode == 2
    wanted = 'set CONFIG_TOML to the run config\'s text (CONFIG_TOML="$(cat run.toml)")'
    assert result.stderr.strip().splitlines() == [f"grpo-stream.sbatch: {wanted}"]


def test_the_config_text_travels_in_the_jobs_environment(sbatch: Path, tmp_path: Path) -> None:
    text = "[trainer]\nrendezvous_port = 29999"  # as $(cat run.toml) gives it
    env = job_env("n[1-3]", RUN_DIR="run", CONFIG_TOML=text, TRAINER_NODES="2")
    result = run_script(sbatch, tmp_path, env, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "run.toml").read_text() == text + "\n"
    torchruns = [s.torchrun for s in read_dry_run(result.stdout).values() if s.torchrun]
    assert len(torchruns) == 2 and all("--master-port=29999" in t for t in torchruns)


def test_a_requeued_job_resumes_its_run(sbatch: Path, tmp_path: Path, cli: Any) -> None:
    """`up` wrote RUN_DIR/config.toml at the first start: the restarted script resumes."""
    env = job_env("n[1-2]", RUN_DIR="run", CONFIG_TOML="[run]\nmax_steps = 5")
    fresh = run_script(sbatch, tmp_path, env, "--dry-run")
    (tmp_path / "run" / "config.toml").write_text("[run]\nmax_steps = 5\n")
    again = run_script(sbatch, tmp_path, env, "--dry-run")
    resumed = []
    for result in (fresh, again):
        assert result.returncode == 0, result.stderr
        services = read_dry_run(result.stdout).values()
        resumed.append({s.instance for s in services if cli.parse_run(s.service).params["resume"]})
    assert resumed == [set(), {"grouper-0", "trainer-0"}]


def test_curve_keys_made_by_the_job_reach_every_client(
    sbatch: Path, tmp_path: Path, cli: Any
) -> None:
    env = job_env("n[1-2]", RUN_DIR="run", CONFIG_TOML="[run]\nmax_steps = 5", CURVE="1")
    result = run_script(sbatch, tmp_path, env, "--dry-run")
    assert result.returncode == 0, result.stderr
    keys = tmp_path / "run" / "private" / "keys"
    assert (keys / "server.key_secret").exists() and (keys / "generator.key_secret").exists()
    assert stat.S_IMODE((tmp_path / "run" / "private").stat().st_mode) == 0o700
    for s in read_dry_run(result.stdout).values():
        if s.instance != "grouper-0":  # the hub reads security.keys_dir on its own node
            params = cli.parse_run(s.service).params
            assert params["keys_dir"] == tmp_path / "run" / "private" / s.instance / "keys"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.slow
def test_script_runs_the_real_services_to_a_finished_run(sbatch: Path, tmp_path: Path) -> None:
    """The script, `up` and the services for real (tiny model, CPU) on two "nodes" of this
    machine, srun replaced by a stand-in that runs each step's one task here: trains,
    every service's secret arrives through srun's stdin, and it stops cleanly."""
    from grpo_stream.training.metrics import read_metrics

    config = (
        "[run]\nmax_steps = 2\n[hub]\ngroups_per_step = 4\n"
        "[generator]\ngroup_size = 4\nprompts_per_request = 4\n[trainer]\ncheckpoint_every = 2\n"
    )
    env = job_env(
        "localhost,127.0.0.1",
        PATH=f"{srun_stand_in(tmp_path)}:{os.environ['PATH']}",
        CONFIG_TOML=config,
        RUN_DIR="run",
        GENERATORS_PER_NODE="1",
        SCORERS="1",
        HUB_PORT=str(_free_port()),
    )
    result = run_script(sbatch, tmp_path, env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = tmp_path / "run"
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    assert (run / "checkpoints" / "step-2" / "COMPLETE").exists()
    secret = (run / "secret").read_text()
    for instance in ("trainer-0", "generator-0", "scorer-0"):
        shipped = run / "private" / instance / "secret"
        assert shipped.read_text() == secret
        assert stat.S_IMODE(shipped.stat().st_mode) == 0o600
        assert stat.S_IMODE(shipped.parent.stat().st_mode) == 0o700
    assert secret.strip() not in result.stdout + result.stderr
