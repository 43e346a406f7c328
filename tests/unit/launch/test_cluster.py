"""Cluster launch files: parsing, placement, each launcher's command line, config overrides."""

from __future__ import annotations

import io
import json
import shlex
import sys
import tarfile
from pathlib import Path

import pytest

from grpo_stream.config import load_config
from grpo_stream.config.cluster import ClusterError, ClusterHost, read_launch_file
from grpo_stream.launch.cluster import (
    config_overrides,
    place,
)
from grpo_stream.launch.devices import placement_for_run
from grpo_stream.launch.placed import placed_specs
from grpo_stream.launch.supervisor import ServiceSpec, Supervisor

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
    spec = place(ClusterHost(name="here"), _spec())
    assert (spec.prefix, spec.argv, spec.host) == ([], _spec().argv, "here")


def test_prefix_launcher_prepends_its_prefix() -> None:
    host = ClusterHost(name="h1", launcher="prefix", prefix=["ip", "netns", "exec", "h1"])
    assert place(host, _spec()).prefix == ["ip", "netns", "exec", "h1"]


def test_slurm_launcher_runs_one_task_on_the_named_node() -> None:
    spec = place(ClusterHost(name="node7", launcher="slurm"), _spec())
    assert spec.prefix == ["srun", "--nodes=1", "--ntasks=1", "-w", "node7", "--overlap"]


def test_slurm_launcher_sets_the_devices_in_the_task_after_slurms_own() -> None:
    """slurmstepd sets CUDA_VISIBLE_DEVICES for a step holding GPUs; ours must win."""
    spec = _spec()
    spec.env = {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    placed = place(ClusterHost(name="node7", launcher="slurm"), spec)
    assert placed.prefix[6:] == ["env", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=3"]


def test_ssh_launcher_sends_one_quoted_command_with_the_hosts_python() -> None:
    host = ClusterHost(name="b", launcher="ssh", ssh="me@b", python="/opt/py", env={"A": "x y"})
    spec = place(host, _spec())
    assert spec.prefix == ["ssh", "-o", "BatchMode=yes", "me@b", "--"]
    assert shlex.split(spec.argv[0]) == ["env", "A=x y", "/opt/py", *_spec().argv[1:]]


def test_prefix_launcher_without_a_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty prefix"):
        ClusterHost(name="a", launcher="prefix")


def test_specs_number_instances_across_hosts_and_name_their_host(tmp_path: Path) -> None:
    path = _write(tmp_path, TWO_HOSTS)
    cluster = read_launch_file(path)
    cfg = load_config(None, [f"run.run_dir={json.dumps(str(tmp_path))}", 'run.placement="none"'])
    placement, _ = placement_for_run(cfg, cluster, False, save=False, environ={})
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


def _secret_spec(tmp_path: Path) -> ServiceSpec:
    (tmp_path / "secret").write_text("5e" * 32)
    spec = _spec()
    spec.argv += ["--secret-file", str(tmp_path / "secret")]
    return spec


@pytest.mark.parametrize("launcher", ["ssh", "slurm"])
def test_remote_launchers_ship_the_secret_on_stdin_not_by_path(
    tmp_path: Path, launcher: str
) -> None:
    """No shared filesystem: the secret travels in the launcher's stdin, and the command
    line names the private copy the receiving end writes on that host."""
    host = ClusterHost(name="b", launcher=launcher, python="/opt/py")  # type: ignore[arg-type]
    spec = place(host, _secret_spec(tmp_path), run_dir=Path("/runs/r"))
    line = " ".join([*spec.prefix, *spec.argv])
    assert "5e" * 32 not in line and str(tmp_path) not in line
    words = shlex.split(spec.argv[0]) if launcher == "ssh" else spec.argv
    assert words[:5] == ["/opt/py", "-m", "grpo_stream.launch.receive",
                         "/runs/r/private/scorer-0", "--"]  # fmt: skip
    assert words[5] == "/opt/py"
    assert words[-2:] == ["--secret-file", "/runs/r/private/scorer-0/secret"]
    assert spec.stdin is not None
    with tarfile.open(fileobj=io.BytesIO(spec.stdin()), mode="r:gz") as tar:
        member = tar.extractfile("secret")
        assert member is not None and member.read() == b"5e" * 32


@pytest.mark.parametrize("launcher", ["local", "prefix"])
def test_launchers_on_this_machine_read_the_files_where_they_are(
    tmp_path: Path, launcher: str
) -> None:
    prefix = ["ip", "netns", "exec", "n1"] if launcher == "prefix" else []
    host = ClusterHost(name="a", launcher=launcher, prefix=prefix)  # type: ignore[arg-type]
    spec = place(host, _secret_spec(tmp_path), run_dir=Path("/runs/r"))
    assert spec.stdin is None and spec.argv == _secret_spec(tmp_path).argv


def test_the_shipment_is_read_at_each_start_not_when_placed(tmp_path: Path) -> None:
    """`up --dry-run` places services before the secret exists; a restart ships it again."""
    spec = place(ClusterHost(name="b", launcher="slurm"), _secret_spec(tmp_path),
                 run_dir=Path("/runs/r"))  # fmt: skip
    (tmp_path / "secret").unlink()
    with pytest.raises(FileNotFoundError):
        assert spec.stdin is not None
        spec.stdin()


def test_the_supervisor_feeds_the_shipment_to_the_launcher(tmp_path: Path) -> None:
    """A real receiving end behind a `prefix`-like launcher that passes stdin on."""
    spec = _secret_spec(tmp_path)
    spec.argv = [sys.executable, "-c", "import sys; print(open(sys.argv[2]).read())",
                 "--secret-file", str(tmp_path / "secret")]  # fmt: skip
    placed = place(ClusterHost(name="b", launcher="slurm", python=sys.executable), spec,
                   run_dir=tmp_path / "remote")  # fmt: skip
    placed.prefix = []  # srun would pass stdin on to its one task: here, the command itself
    sup = Supervisor()
    proc = sup.start(placed)
    assert proc.popen.wait(timeout=60) == 0
    lines = [e.get("line") for e in sup.drain(1.0)]
    assert "5e" * 32 in lines
