"""Cluster files: parsing, recorded and auto devices, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_stream.config.cluster import ClusterError, ClusterHost, parse_params
from grpo_stream.hardware.cluster import host_devices, load_cluster
from grpo_stream.hardware.recorded import load_recorded

EXAMPLE = Path(__file__).parents[3] / "examples" / "cluster.toml"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def test_example_cluster_file_loads_every_device():
    cluster = load_cluster(EXAMPLE)
    assert [d.device_id for d in cluster.devices] == [
        "dgx-a:0",
        "dgx-a:1",
        "ws-b:0",
        "ws-b:1",
        "old-c:0",
    ]
    assert cluster.latency_s["old-c:0"] == pytest.approx(0.002)
    assert cluster.spec.model_params == 1_500_000_000


@pytest.mark.parametrize(
    ("text", "value"),
    [(7_000, 7_000), ("7B", 7 * 10**9), ("1.5b", 1_500_000_000), ("350M", 350 * 10**6)],
)
def test_parameter_counts_accept_suffixes(text, value):
    assert parse_params(text) == value


def test_an_unknown_recorded_device_names_the_known_ones(tmp_path):
    path = _write(
        tmp_path,
        'model_params = 1000\n[[hosts]]\nname = "a"\naddress = "x"\ndevices = ["h100", "l4"]\n',
    )
    with pytest.raises(ClusterError, match=r"hosts\.0\.devices\.0: .*known: .*h100-sxm"):
        load_cluster(path)


def test_invalid_toml_is_one_line(tmp_path):
    with pytest.raises(ClusterError) as info:
        load_cluster(_write(tmp_path, "model_params = = 3\n"))
    assert "invalid TOML" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_field_is_named(tmp_path):
    with pytest.raises(ClusterError, match="hosts: Field required"):
        load_cluster(_write(tmp_path, "model_params = 1000\n"))


def test_an_unknown_key_is_refused(tmp_path):
    text = (
        'model_params = 1000\nmodle = 3\n[[hosts]]\nname = "a"\naddress = "x"\ndevices = ["l4"]\n'
    )
    with pytest.raises(ClusterError, match="modle"):
        load_cluster(_write(tmp_path, text))


def test_duplicate_host_names_are_refused(tmp_path):
    host = '[[hosts]]\nname = "a"\naddress = "x"\ndevices = ["l4"]\n'
    with pytest.raises(ClusterError, match="unique: a"):
        load_cluster(_write(tmp_path, "model_params = 1000\n" + host + host))


def test_auto_numbers_the_devices_of_a_host_one_after_another() -> None:
    gpu = load_recorded("h100-sxm", host="elsewhere", index=5)
    host = ClusterHost(name="n1", devices=["a100-40gb-sxm", "auto"])
    devices = host_devices(host, 0, live=lambda: [gpu, gpu, gpu])
    assert [d.device_id for d in devices] == ["n1:0", "n1:1", "n1:2", "n1:3"]


def test_a_missing_file_is_reported(tmp_path):
    with pytest.raises(ClusterError, match="not found"):
        load_cluster(tmp_path / "nope.toml")


def test_auto_fingerprints_this_machine(tmp_path):
    text = 'model_params = 1000\n[[hosts]]\nname = "me"\naddress = "x"\ndevices = ["auto"]\n'
    cluster = load_cluster(_write(tmp_path, text))
    assert cluster.devices
    assert all(d.host == "me" for d in cluster.devices)
