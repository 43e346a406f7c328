"""Placement over recorded NVML fingerprints: which GPUs each service gets, and the
CUDA_VISIBLE_DEVICES and ranks it starts with (NVML replaced at its boundary)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from grpo_stream.config import RunConfig, load_config
from grpo_stream.config.cluster import read_launch_file
from grpo_stream.hardware.recorded import RecordedNvml, load_record
from grpo_stream.launch.devices import (
    local_fingerprint,
    local_host,
    placement_for_run,
)
from grpo_stream.launch.placed import cluster_overrides, placed_services
from grpo_stream.launch.placement import Placement, PlacementError, place
from grpo_stream.launch.supervisor import ServiceSpec
from grpo_stream.rewards.sizing import ENV_WORKERS

B7 = 7_000_000_000
SMALL = 100_000_000


def _cfg(*sets: str) -> RunConfig:
    return load_config(None, list(sets))


def _nvml(*names: str) -> RecordedNvml:
    return RecordedNvml([load_record(n) for n in names])


def _local(cfg: RunConfig, *names: str, visible: str | None = None) -> Placement:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    host = local_host(cfg, local_fingerprint(_nvml(*names)), env)
    return place(cfg, [host], SMALL)


def _env(cfg: RunConfig, placement: Placement) -> dict[str, str | None]:
    """instance -> CUDA_VISIBLE_DEVICES it starts with (None: not set)."""
    services = placed_services(cfg, placement, "tcp://h:1", False)
    return {s.instance: s.env.get("CUDA_VISIBLE_DEVICES") for s, _ in services}


def test_8xh100_trainer_ranks_on_the_first_gpus_and_one_generator_per_other_gpu() -> None:
    cfg = _cfg("trainer.ranks=4")
    placement = _local(cfg, *["h100-sxm"] * 8)
    assert _env(cfg, placement) == {
        "trainer-0": "0,1,2,3",
        "generator-0": "4",
        "generator-1": "5",
        "generator-2": "6",
        "generator-3": "7",
        "scorer-0": "",
    }
    assert placement.trainer[0].ranks == 4


def test_8xh100_trainer_runs_one_torchrun_rank_per_gpu() -> None:
    cfg = _cfg("trainer.ranks=4")
    trainer, _ = placed_services(cfg, _local(cfg, *["h100-sxm"] * 8), "tcp://h:1", False)[0]
    assert trainer.argv[1:6] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=4",
        "-m",
    ]


def test_tensor_parallel_generators_get_consecutive_gpus() -> None:
    cfg = _cfg("trainer.ranks=2", "generator.tensor_parallel=2")
    env = _env(cfg, _local(cfg, *["h100-sxm"] * 8))
    gens = {k: v for k, v in env.items() if k.startswith("generator")}
    assert gens == {"generator-0": "2,3", "generator-1": "4,5", "generator-2": "6,7"}


def test_a_gpu_left_over_by_tensor_parallel_is_idle_with_the_reason() -> None:
    cfg = _cfg("generator.tensor_parallel=2")
    placement = _local(cfg, *["h100-sxm"] * 4)
    assert [g.devices for g in placement.generators] == [(1, 2)]
    assert len(placement.idle) == 1 and "tensor_parallel = 2" in placement.idle[0][1]


def test_cpu_only_host_sets_no_device_environment() -> None:
    cfg = _cfg("trainer.ranks=2")
    host = local_host(
        cfg, local_fingerprint(RecordedNvml([], init_error="NVMLError_LibraryNotFound")), {}
    )
    placement = place(cfg, [host], None)
    services = placed_services(cfg, placement, "tcp://h:1", False)
    assert placement.mode == "none"
    assert all(set(spec.env) <= {ENV_WORKERS} for spec, _ in services)  # scorer.workers only
    assert "--nproc-per-node=2" in services[0][0].argv


def test_colocated_one_gpu_trainer_and_generator_share_it() -> None:
    cfg = _cfg(
        "run.placement=colocated", "generator.engine=vllm", "generator.gpu_memory_utilization=0.5"
    )
    placement = _local(cfg, "h100-sxm")
    assert _env(cfg, placement) == {"trainer-0": "0", "generator-0": "0", "scorer-0": ""}


def test_one_gpu_under_plan_is_colocated_when_it_holds_both() -> None:
    cfg = _cfg()
    assert _local(cfg, "h100-sxm").mode == "colocated"


def test_colocated_reservation_that_starves_the_trainer_is_one_line_with_numbers() -> None:
    cfg = _cfg(
        "run.placement=colocated",
        "generator.engine=vllm",
        "generator.gpu_memory_utilization=0.9",
        "model.params=3000000000",
    )
    host = local_host(cfg, local_fingerprint(_nvml("h100-sxm")), {})
    with pytest.raises(PlacementError, match=r"trainer needs 60\.3 GiB .*<= 0\.24") as info:
        place(cfg, [host], cfg.model.params)
    assert "\n" not in str(info.value)


def test_plan_that_cannot_fit_the_model_names_the_memory_rule() -> None:
    cfg = _cfg()
    host = local_host(cfg, local_fingerprint(_nvml("l4", "l4")), {})
    with pytest.raises(
        PlacementError, match=r"needs 1 device\(s\) with >= 140\.8 GiB for 7,000,000,000"
    ):
        place(cfg, [host], B7)


def test_manual_devices_naming_a_missing_gpu_is_refused() -> None:
    cfg = _cfg("run.placement=manual", "trainer.devices=[0]", "generator.devices=[9]")
    host = local_host(cfg, local_fingerprint(_nvml(*["h100-sxm"] * 8)), {})
    with pytest.raises(
        PlacementError, match=r"generator\.devices names GPU 9, but local has 8 GPU\(s\): 0-7"
    ):
        place(cfg, [host], SMALL)


def test_manual_devices_hidden_by_cuda_visible_devices_is_refused() -> None:
    cfg = _cfg("run.placement=manual", "trainer.devices=[0]", "generator.devices=[3]")
    host = local_host(
        cfg, local_fingerprint(_nvml(*["h100-sxm"] * 4)), {"CUDA_VISIBLE_DEVICES": "0,1"}
    )
    with pytest.raises(
        PlacementError,
        match=r"CUDA_VISIBLE_DEVICES=0,1 on local hides GPU 3, which generator\.devices names",
    ):
        place(cfg, [host], SMALL)


def test_manual_devices_start_each_service_on_the_gpus_named() -> None:
    cfg = _cfg("run.placement=manual", "trainer.devices=[3]", "generator.devices=[1]")
    placement = _local(cfg, *["h100-sxm"] * 4)
    assert _env(cfg, placement) == {"trainer-0": "3", "generator-0": "1", "scorer-0": ""}
    assert [device_id.split(":")[1] for device_id, _ in placement.idle] == ["0", "2"]


def test_plan_keeps_to_the_gpus_cuda_visible_devices_leaves() -> None:
    cfg = _cfg()
    placement = _local(cfg, *["h100-sxm"] * 4, visible="2,3")
    assert _env(cfg, placement) == {"trainer-0": "2", "generator-0": "3", "scorer-0": ""}


MIXED = """
hub_port = 5555
[[hosts]]
name = "a"
address = "10.0.0.1"
devices = ["h100-sxm"]
services = { hub = 1, trainer = 1, scorer = 1 }
[[hosts]]
name = "b"
address = "10.0.0.2"
launcher = "ssh"
devices = ["a10"]
services = { generator = 1 }
"""


def test_mixed_h100_and_a10_pair_trains_on_the_h100_and_generates_on_the_a10(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(MIXED)
    cluster = read_launch_file(path)
    cfg = _cfg("model.params=1000000000", f'run.run_dir="{tmp_path / "run"}"')
    placement, _ = placement_for_run(cfg, cluster, False, save=False, environ={})
    services = {
        s.instance: (s, slot)
        for s, slot in placed_services(cfg, placement, "tcp://10.0.0.1:5555", False, cluster)
    }
    trainer, t_slot = services["trainer-0"]
    gen, g_slot = services["generator-0"]
    assert (trainer.host, trainer.env["CUDA_VISIBLE_DEVICES"], t_slot.device_ids) == (
        "a",
        "0",
        ("a:0",),
    )
    assert (gen.host, g_slot.device_ids) == ("b", ("b:0",))
    # over ssh the device environment travels in the remote command line
    assert shlex.split(gen.argv[0])[:3] == [
        "env",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES=0",
    ]
    assert services["scorer-0"][0].env["CUDA_VISIBLE_DEVICES"] == ""


def test_a_changed_gpu_fingerprint_re_plans_on_resume(tmp_path: Path) -> None:
    from grpo_stream.launch.devices import remember

    cfg = _cfg(f'run.run_dir="{tmp_path}"')
    before = [local_host(cfg, local_fingerprint(_nvml("l4", "h100-sxm")), {})]
    first, _ = remember(tmp_path, before, place(cfg, before, SMALL), resume=False)
    after = [local_host(cfg, local_fingerprint(_nvml("l4", "l4")), {})]
    second, notes = remember(tmp_path, after, place(cfg, after, SMALL), resume=True)
    assert first.trainer[0].devices == (1,)
    assert second.trainer[0].devices == (0,)
    assert "NVIDIA H100 80GB HBM3 -> NVIDIA L4" in notes[0] and "re-planned" in notes[0]


def test_resume_on_the_same_gpus_keeps_the_saved_placement(tmp_path: Path) -> None:
    import json

    from grpo_stream.launch.devices import remember

    cfg = _cfg()
    hosts = [local_host(cfg, local_fingerprint(_nvml("h100-sxm", "h100-sxm")), {})]
    remember(tmp_path, hosts, place(cfg, hosts, SMALL), resume=False, inputs={"ranks": 1})
    saved = json.loads((tmp_path / "placement.json").read_text())
    saved["trainer"][0]["devices"] = [1]  # as an earlier version of the plan might have put it
    (tmp_path / "placement.json").write_text(json.dumps(saved))
    again, notes = remember(tmp_path, hosts, place(cfg, hosts, SMALL), True, {"ranks": 1})
    assert again.trainer[0].devices == (1,) and notes == []


def test_resume_with_other_placement_settings_places_afresh(tmp_path: Path) -> None:
    from grpo_stream.launch.devices import remember

    cfg, two = _cfg(), _cfg("trainer.ranks=2")
    hosts = [local_host(cfg, local_fingerprint(_nvml(*["h100-sxm"] * 4)), {})]
    remember(tmp_path, hosts, place(cfg, hosts, SMALL), resume=False, inputs={"ranks": 1})
    hosts2 = [local_host(two, local_fingerprint(_nvml(*["h100-sxm"] * 4)), {})]
    again, _ = remember(tmp_path, hosts2, place(two, hosts2, SMALL), True, {"ranks": 2})
    assert again.trainer[0].devices == (0, 1)


TWO_TRAINERS = """
hub_port = 5555
[[hosts]]
name = "a"
address = "10.0.0.1"
devices = ["h100-sxm", "h100-sxm"]
launcher = "ssh"
services = { hub = 1, trainer = 2, scorer = 1 }
gpus = { trainer = [0, 1] }
[[hosts]]
name = "b"
address = "10.0.0.2"
devices = ["h100-sxm", "h100-sxm", "h100-sxm"]
launcher = "slurm"
services = { trainer = 2, generator = 1 }
gpus = { trainer = [1, 2], generator = [0] }
"""


def _two_trainer_hosts(tmp_path: Path) -> dict[str, ServiceSpec]:
    path = tmp_path / "cluster.toml"
    path.write_text(TWO_TRAINERS)
    cluster = read_launch_file(path)
    cfg = _cfg('run.placement="manual"', "trainer.ranks=4")
    placement, _ = placement_for_run(cfg, cluster, False, save=False, environ={})
    services = placed_services(cfg, placement, "tcp://10.0.0.1:5555", False, cluster)
    return {spec.instance: spec for spec, _ in services}


def _torchrun_args(argv: list[str]) -> argparse.Namespace:
    """torchrun's own parse of a node's command (after the rendezvous wait, if any)."""
    from torch.distributed.run import get_args_parser

    start = argv.index("torch.distributed.run") + 1
    return get_args_parser().parse_args(argv[start:])


def test_trainer_ranks_on_two_hosts_run_torchrun_multi_node(tmp_path: Path) -> None:
    specs = _two_trainer_hosts(tmp_path)
    first = _torchrun_args(shlex.split(specs["trainer-0"].argv[0]))  # over ssh: one line
    second = _torchrun_args(specs["trainer-0-n1"].argv)
    for node_rank, args in enumerate((first, second)):
        assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", node_rank, "2")
        assert (args.master_addr, args.master_port) == ("10.0.0.1", 29500)
    assert specs["trainer-0-n1"].env["CUDA_VISIBLE_DEVICES"] == "1,2"


def test_the_second_trainer_host_waits_for_the_rendezvous_through_its_launcher(
    tmp_path: Path,
) -> None:
    spec = _two_trainer_hosts(tmp_path)["trainer-0-n1"]
    assert spec.prefix[:6] == ["srun", "--nodes=1", "--ntasks=1", "-w", "b", "--overlap"]
    assert spec.prefix[6] == "env" and "CUDA_VISIBLE_DEVICES=1,2" in spec.prefix  # its GPUs
    # its shipped files are unpacked first (no shared filesystem), then it waits
    assert spec.argv[1:3] == ["-m", "grpo_stream.launch.receive"]
    waits = spec.argv[spec.argv.index("--") + 1 :]
    assert waits[1:5] == [
        "-m",
        "grpo_stream.launch.rendezvous",
        "--address=10.0.0.1:29500",
        "--host-name=b",
    ]


def test_rank_zero_binds_the_weights_on_the_first_trainer_host(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(TWO_TRAINERS)
    cluster = read_launch_file(path)
    cfg = _cfg('run.placement="manual"', "trainer.ranks=4")
    placement, _ = placement_for_run(cfg, cluster, False, save=False, environ={})
    overrides = cluster_overrides(cluster, placement)
    resolved = load_config(None, overrides)
    assert resolved.trainer.public_host == "10.0.0.1"
    assert resolved.trainer.ranks == 4


def test_under_plan_a_teacher_takes_a_generators_gpu_while_one_generator_keeps_its_own() -> None:
    cfg = _cfg("trainer.ranks=4", "algo.distill.teacher=x", "teacher.count=2")
    env = _env(cfg, _local(cfg, *["h100-sxm"] * 6))
    assert env == {
        "trainer-0": "0,1,2,3",
        "generator-0": "4",
        "scorer-0": "",
        "teacher-0": "5",
        "teacher-1": "",  # no generator's GPU left to take: it runs without one
    }
