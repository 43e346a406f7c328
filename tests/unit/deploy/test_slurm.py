"""deploy/slurm/grpo-stream.sbatch, run by bash with Slurm replaced at its boundary.

`srun` and `scontrol` are stand-ins that run each task of a step as a local process with
Slurm's task variables (SLURMD_NODENAME, SLURM_LOCALID, SLURM_PROCID); `grpo-stream` is a
stand-in that records its argv, node and CUDA_VISIBLE_DEVICES and waits for SIGTERM. The
script itself runs unmodified, so placement, GPU pinning, the command lines and the stop
sequence are the ones a cluster would see; the command lines are then parsed by the real CLI.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .slurm_harness import SlurmRun, stubs


def test_sbatch_passes_bash_syntax_check(sbatch: Path) -> None:
    result = subprocess.run(["bash", "-n", str(sbatch)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_hub_scorers_and_trainer_run_on_the_first_node(jobs: dict[str, SlurmRun]) -> None:
    assert [(r["node"], r["cuda"]) for r in jobs["three"].starts("grouper")] == [("node1", "")]
    assert [(r["node"], r["cuda"]) for r in jobs["three"].starts("scorer")] == [("node1", "")] * 2
    assert [(r["node"], r["cuda"]) for r in jobs["three"].starts("trainer")] == [("node1", "0")]


def test_generators_run_on_the_other_nodes_one_gpu_each(jobs: dict[str, SlurmRun]) -> None:
    placed = sorted((r["node"], r["cuda"]) for r in jobs["three"].starts("generator"))
    assert placed == [("node2", "0"), ("node2", "1"), ("node3", "0"), ("node3", "1")]


def test_every_service_gets_a_unique_instance_name(jobs: dict[str, SlurmRun], cli: Any) -> None:
    names = [cli.parse_run(r["argv"]).params["instance"] for r in jobs["three"].events("start")]
    assert len(set(names)) == len(names) == 8
    assert "generator-node3-1" in names


def test_hub_command_binds_the_ports_the_others_dial(jobs: dict[str, SlurmRun], cli: Any) -> None:
    (hub,) = jobs["three"].starts("grouper")
    cfg = cli.hub_config(cli.parse_run(hub["argv"]))
    assert cfg.hub.bind == "tcp://0.0.0.0:6000"
    assert cfg.hub.public_address == "tcp://node1:6000"
    assert (cfg.trainer.bind, cfg.trainer.public_host) == ("tcp://0.0.0.0:6001", "node1")
    assert cfg.run.run_dir.name == "run" and cfg.run.run_dir.is_absolute()
    clients = [r for r in jobs["three"].records if r["event"] == "start" and r is not hub]
    assert {cli.parse_run(r["argv"]).params["hub"] for r in clients} == {"tcp://node1:6000"}


def test_only_hub_and_trainer_resume(jobs: dict[str, SlurmRun], cli: Any) -> None:
    resumed = {
        r["service"]
        for r in jobs["three"].events("start")
        if cli.parse_run(r["argv"]).params["resume"]
    }
    assert resumed == {"grouper", "trainer"}


def test_script_stops_the_rest_and_exits_with_the_trainers_status(
    jobs: dict[str, SlurmRun],
) -> None:
    assert jobs["three"].rc == 7, jobs["three"].stderr
    others = [r for r in jobs["three"].events("start") if r["service"] != "trainer"]
    assert len(jobs["three"].events("terminated")) == len(others) == 7
    assert not jobs["three"].events("timeout")


def test_one_node_runs_generators_beside_the_trainer_from_gpu_one(
    jobs: dict[str, SlurmRun],
) -> None:
    assert jobs["one"].rc == 0, jobs["one"].stderr
    placed = sorted((r["node"], r["cuda"]) for r in jobs["one"].starts("generator"))
    assert placed == [("solo", "1"), ("solo", "2"), ("solo", "3")]
    assert [r["cuda"] for r in jobs["one"].starts("trainer")] == ["0"]


def test_config_text_and_scorer_node(jobs: dict[str, SlurmRun], cli: Any) -> None:
    run = jobs["scorer_node"]
    (hub,) = run.starts("grouper")
    config = Path(cli.parse_run(hub["argv"]).params["config"])
    assert config.read_text() == "[run]\nmax_steps = 5\n"
    assert [r["node"] for r in run.starts("scorer")] == ["node3"]
    assert [r["node"] for r in run.starts("generator")] == ["node2"]
    assert [r["node"] for r in run.starts("trainer")] == ["node1"]


def test_no_config_fails_with_one_line(sbatch: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CONFIG"))}
    env["RUN_DIR"] = str(tmp_path / "run")
    result = subprocess.run(["bash", str(sbatch)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=30)  # fmt: skip
    assert result.returncode == 2
    wanted = 'set CONFIG_TOML to the run config\'s text (CONFIG_TOML="$(cat run.toml)")'
    assert result.stderr.strip().splitlines() == [f"grpo-stream.sbatch: {wanted}"]


def test_hub_exit_stops_the_trainer_and_fails_the_job(jobs: dict[str, SlurmRun]) -> None:
    run = jobs["hub_exit"]
    assert run.rc == 1, run.stderr
    stopped = [r["service"] for r in run.events("terminated")]
    assert stopped[0] == "trainer"
    assert sorted(stopped) == ["generator", "scorer", "trainer"]


def test_trainer_finishing_after_the_hub_stopped_is_a_success(jobs: dict[str, SlurmRun]) -> None:
    run = jobs["done"]
    assert run.rc == 0, run.stderr
    assert [r["service"] for r in run.events("exit")] == ["grouper", "trainer"]
    assert sorted(r["service"] for r in run.events("terminated")) == ["generator", "scorer"]


def test_sigterm_stops_the_trainer_first_then_the_rest(jobs: dict[str, SlurmRun]) -> None:
    run = jobs["sigterm"]
    assert run.rc == 0, run.stderr
    stopped = [r["service"] for r in run.events("terminated")]
    assert stopped[0] == "trainer"
    assert stopped[-1] == "grouper"
    assert sorted(stopped) == ["generator", "grouper", "scorer", "trainer"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.slow
def test_script_runs_the_real_services_to_a_finished_run(sbatch: Path, tmp_path: Path) -> None:
    """The script with the real `grpo-stream` (tiny model, CPU): trains and stops cleanly."""
    from grpo_stream.training.metrics import read_metrics

    bin_dir = stubs(tmp_path)
    (bin_dir / "grpo-stream").unlink()  # the real one, from this interpreter's environment
    (tmp_path / "run.toml").write_text(
        "[run]\nmax_steps = 2\n[hub]\ngroups_per_step = 4\n"
        "[generator]\ngroup_size = 4\nprompts_per_request = 4\n[trainer]\ncheckpoint_every = 2\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLURM")},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "localhost,localhost",
        "CONFIG": "run.toml",
        "RUN_DIR": "run",
        "GENERATORS_PER_NODE": "1",
        "SCORERS": "1",
        "HUB_PORT": str(_free_port()),
        "TRAINER_PORT": str(_free_port()),
        "POLL_S": "0.5",
        "STOP_TIMEOUT_S": "60",
        "GRPO_STREAM": str(Path(sys.executable).parent / "grpo-stream"),
    }
    result = subprocess.run(
        ["bash", str(sbatch)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    logs = "\n".join(p.read_text()[-1500:] for p in (tmp_path / "run" / "slurm-logs").glob("*"))
    assert result.returncode == 0, result.stderr + logs
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert (tmp_path / "run" / "checkpoints" / "step-2" / "COMPLETE").exists()


def test_trainer_ranks_span_the_first_nodes_two_gpus_each(jobs: dict[str, SlurmRun]) -> None:
    run = jobs["ranks"]
    assert run.rc == 0, run.stderr
    placed = sorted((r["node"], r["cuda"]) for r in run.starts("trainer"))
    assert placed == [("node1", "0,1"), ("node2", "0,1")]
    generators = sorted((r["node"], r["cuda"]) for r in run.starts("generator"))
    assert generators == [("node3", "0"), ("node3", "1")]


def test_each_trainer_node_runs_torchrun_with_its_node_rank(jobs: dict[str, SlurmRun]) -> None:
    from torch.distributed.run import get_args_parser

    parsed = {}
    for r in jobs["ranks"].events("torchrun"):
        args = get_args_parser().parse_args(r["argv"])  # torchrun's own parser
        parsed[r["node"]] = (args.nnodes, args.node_rank, args.nproc_per_node, args.master_addr)
        assert args.no_python and args.master_port == 29500
        assert args.training_script == "grpo-stream"
    assert parsed == {"node1": ("2", 0, "2", "node1"), "node2": ("2", 1, "2", "node1")}


def test_trainer_program_under_torchrun_parses_with_the_cli(
    jobs: dict[str, SlurmRun], cli: Any
) -> None:
    for r in jobs["ranks"].starts("trainer"):
        params = cli.parse_run(r["argv"]).params
        assert params["hub"] == "tcp://node1:5555" and params["resume"]
