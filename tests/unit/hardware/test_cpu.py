"""The CPU fingerprint's parts: model name, cores, micro-benchmarks."""

from __future__ import annotations

import os

from grpo_stream.hardware.cpu import copy_gbps, cpu_cores, cpu_model, fingerprint_cpu, matmul_gflops


def test_model_name_is_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Test CPU 9000\n")
    assert cpu_model(info) == "Test CPU 9000"


def test_model_name_falls_back_without_cpuinfo(tmp_path):
    assert cpu_model(tmp_path / "missing")


def test_cores_are_those_this_process_may_use():
    assert cpu_cores() == len(os.sched_getaffinity(0))


def test_matmul_benchmark_reports_a_positive_rate():
    assert matmul_gflops(0.02) > 0


def test_copy_benchmark_reports_a_positive_rate():
    assert copy_gbps(0.02) > 0


def test_without_benchmark_compute_is_unknown_not_guessed():
    device = fingerprint_cpu(benchmark=False)
    assert device.fp32_tflops is None
    assert device.memory_bandwidth_gbps is None
    assert device.measured == {}
