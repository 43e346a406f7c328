"""The hub's registry: what `status` shows of each peer."""

from __future__ import annotations

from grpo_stream.hardware.fingerprint import fingerprint_host
from grpo_stream.hardware.recorded import RecordedNvml, load_record
from grpo_stream.hub.registry import Peer
from grpo_stream.launch.devices import assigned


def _host(*names: str):
    return fingerprint_host(benchmark=False, nvml=RecordedNvml([load_record(n) for n in names]))


def test_the_hub_shows_the_gpus_a_peer_holds() -> None:
    host = assigned(_host("h100-sxm", "h100-sxm"), {"CUDA_VISIBLE_DEVICES": "1"})
    peer = Peer("generator", "generator-0", b"id", "h", 1, 0, host.to_dict())
    assert peer.describe()["devices"] == f"{host.hostname}:1"


def test_a_peer_without_nvml_shows_cpu() -> None:
    peer = Peer("scorer", "scorer-0", b"id", "h", 1, 0, {"source": "cpu", "devices": []})
    assert peer.describe()["devices"] == "cpu"
