"""fingerprint_host: GPUs through NVML, else the CPU; JSON-able for the Hello."""

from __future__ import annotations

import json
import sys

import msgpack
import pytest

from grpo_stream.hardware.device import HostFingerprint
from grpo_stream.hardware.fingerprint import fingerprint_host


def test_gpus_are_read_through_the_pynvml_boundary(monkeypatch, fake_nvml):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml("h100-sxm", "l4"))
    host = fingerprint_host()
    assert host.source == "nvml"
    assert [d.name for d in host.devices] == ["NVIDIA H100 80GB HBM3", "NVIDIA L4"]
    assert [d.index for d in host.devices] == [0, 1]


def test_a_host_without_a_driver_gets_a_cpu_fingerprint(fake_nvml):
    host = fingerprint_host(
        benchmark=False, nvml=fake_nvml("l4", init_error="NVMLError_DriverNotLoaded")
    )
    assert host.source == "cpu"
    assert host.nvml_error == "NVMLError_DriverNotLoaded"
    assert host.devices[0].kind == "cpu"


def test_nvml_with_no_devices_gets_a_cpu_fingerprint(fake_nvml):
    host = fingerprint_host(benchmark=False, nvml=fake_nvml())
    assert host.source == "cpu"
    assert host.nvml_error == "no NVML devices"


def test_this_machine_without_nvml_gets_a_measured_cpu_fingerprint():
    host = fingerprint_host(benchmark=True, seconds=0.05)
    if host.source == "nvml":
        pytest.skip("this machine has NVML and a GPU")
    cpu = host.devices[0]
    assert host.nvml_error is not None
    assert cpu.cpu_cores >= 1
    assert cpu.memory_total_bytes > 0
    assert cpu.name
    assert cpu.fp32_tflops > 0
    assert cpu.memory_bandwidth_gbps > 0
    assert set(cpu.measured) == {"fp32_tflops", "memory_bandwidth_gbps"}


def test_host_fingerprint_round_trips_through_json(fake_nvml):
    host = fingerprint_host(nvml=fake_nvml("t4", "rtx-4090"))
    back = HostFingerprint.from_dict(json.loads(json.dumps(host.to_dict())))
    assert back.to_dict() == host.to_dict()


def test_host_fingerprint_dict_packs_with_msgpack(fake_nvml):
    host = fingerprint_host(nvml=fake_nvml("a100-40gb-sxm"))
    data = host.to_dict()
    assert msgpack.unpackb(msgpack.packb(data)) == data


def test_hello_dict_leaves_out_the_raw_answers(fake_nvml):
    data = fingerprint_host(nvml=fake_nvml("l4")).to_dict()
    assert "raw" not in data["devices"][0]
