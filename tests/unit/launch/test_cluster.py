"""Cluster launch files: parsing, placement, each launcher's command line, config overrides."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from grpo_stream.config import load_config
from grpo_stream.hardware.cluster import ClusterError
from grpo_stream.launch.cluster import (
    LaunchHost,
    config_overrides,
    place,
    read_launch_file,
)
from grpo_stream.launch.devices import placement_for_run
from grpo_stream.launch.placed import placed_specs
from grpo_stream.launch.supervisor import ServiceSpec

NETNS = Path(__file__).parents[3] / "examples" / "cluster-netns.toml"
TWO_HOSTS = """
model_params = "7B"
hub_port = 5555
[[hosts]]
name = "a"
address = "10.0.0.1"
bind = "0.0.0.0"
devices = ["h100-sxm"]
services = { hub = 1, trainer = 1, scorer = 2 }
[[hosts]]
name = "b"
address = "10.0.0.2"
launcher = "ssh"
ssh = "me@b"
python = "/opt/venv/bin/python"
services = { generator = 2 }
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def _spec() -> ServiceSpec:
    argv = [sys.executable, "-m", "grpo_stream.cli.main", "run", "scorer", "--hub", "tcp://x:1"]
    return ServiceSpec("scorer-0", "scorer", argv)


def test_example_netns_file_places_hub_and_trainer_on_the_first_host() -> None:
    cluster = read_launch_file(NETNS)
    assert cluster.host_of("hub").name == cluster.host_of("trainer").name == "gs-h1"
    assert cluster.host_of("generator").address == "192.168.77.2"


def test_plan_only_keys_are_accepted_and_ignored(tmp_path: Path) -> None:
    cluster = read_launch_file(_write(tmp_path, TWO_HOSTS))
    assert [h.name for h in cluster.hosts] == ["a", "b"]


def test_two_hubs_are_refused_in_one_line(tmp_path: Path) -> None:
    text = (
        '[[hosts]]\nname="a"\nservices={hub=1,trainer=1}\n[[hosts]]\nname="b"\nservices={hub=1}\n'
    )
    with pytest.raises(ClusterError, match="exactly one host must run the hub, found 2") as info:
        read_launch_file(_write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_an_unknown_service_is_named(tmp_path: Path) -> None:
    text = '[[hosts]]\nname="a"\nservices={hub=1,trainer=1,sampler=1}\n'
    with pytest.raises(ClusterError, match=r"hosts\.0: .*unknown service 'sampler'"):
        read_launch_file(_write(tmp_path, text))


def test_hub_on_all_interfaces_needs_a_fixed_port(tmp_path: Path) -> None:
    text = '[[hosts]]\nname="a"\nbind="0.0.0.0"\nservices={hub=1,trainer=1}\n'
    with pytest.raises(ClusterError, match="needs hub_port"):
        read_launch_file(_write(tmp_path, text))


def test_overrides_bind_all_interfaces_and_advertise_the_address(tmp_path: Path) -> None:
    cfg = load_config(None, config_overrides(read_launch_file(_write(tmp_path, TWO_HOSTS))))
    assert cfg.hub.bind == "tcp://0.0.0.0:5555"
    assert cfg.hub.public_address == "tcp://10.0.0.1:5555"
    assert cfg.trainer.bind == "tcp://0.0.0.0:0"
    assert cfg.trainer.public_host == "10.0.0.1"


def test_local_launcher_runs_the_command_as_is() -> None:
    spec = place(LaunchHost(name="here"), _spec())
    assert (spec.prefix, spec.argv, spec.host) == ([], _spec().argv, "here")


def test_prefix_launcher_prepends_its_prefix() -> None:
    host = LaunchHost(name="h1", launcher="prefix", prefix=["ip", "netns", "exec", "h1"])
    assert place(host, _spec()).prefix == ["ip", "netns", "exec", "h1"]


def test_slurm_launcher_runs_one_task_on_the_named_node() -> None:
    spec = place(LaunchHost(name="node7", launcher="slurm"), _spec())
    assert spec.prefix == ["srun", "--nodes=1", "--ntasks=1", "-w", "node7", "--overlap"]


def test_ssh_launcher_sends_one_quoted_command_with_the_hosts_python() -> None:
    host = LaunchHost(name="b", launcher="ssh", ssh="me@b", python="/opt/py", env={"A": "x y"})
    spec = place(host, _spec())
    assert spec.prefix == ["ssh", "-o", "BatchMode=yes", "me@b", "--"]
    assert shlex.split(spec.argv[0]) == ["env", "A=x y", "/opt/py", *_spec().argv[1:]]


def test_prefix_launcher_without_a_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty prefix"):
        LaunchHost(name="a", launcher="prefix")


def test_specs_number_instances_across_hosts_and_name_their_host(tmp_path: Path) -> None:
    path = _write(tmp_path, TWO_HOSTS)
    cluster = read_launch_file(path)
    cfg = load_config(None, [f"run.run_dir={json.dumps(str(tmp_path))}", 'run.placement="none"'])
    placement, _ = placement_for_run(cfg, cluster, path, False, save=False, environ={})
    specs = placed_specs(cfg, placement, "tcp://10.0.0.1:5555", resume=False, cluster=cluster)
    where = {s.instance: s.host for s in specs}
    assert where == {
        "trainer-0": "a",
        "generator-0": "b",
        "generator-1": "b",
        "scorer-0": "a",
        "scorer-1": "a",
    }
    generator = next(s for s in specs if s.instance == "generator-1")
    assert "--instance generator-1" in generator.argv[0]
