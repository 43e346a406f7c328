"""Derived peaks of the recorded devices against their published datasheets.

Tolerances: 3% for bandwidth, FP32 and tensor peaks, except H100 SXM's tensor peak (10%):
its datasheet 989 TFLOPS assumes a 1830 MHz clock where NVML's boost clock is 1980 MHz
(grpo_stream.hardware.specs documents the 8% difference).
"""

from __future__ import annotations

import pytest

from grpo_stream.hardware.recorded import load_recorded
from grpo_stream.hardware.specs import derive_gpu

DATASHEETS = [
    # name, HBM/GDDR GB/s, dense bf16 (fp16 on T4) tensor TFLOPS, tensor tolerance, FP32 TFLOPS
    ("h100-sxm", 3350, 989, 0.10, 67.0),
    ("a100-40gb-sxm", 1555, 312, 0.03, 19.5),
    ("l4", 300, 121, 0.03, 30.3),
    ("rtx-4090", 1008, 165.2, 0.03, 82.6),
    ("t4", 320, 65, 0.03, 8.1),
]


@pytest.mark.parametrize(("name", "gbps", "_tf", "_tol", "_fp32"), DATASHEETS)
def test_memory_bandwidth_matches_datasheet(name, gbps, _tf, _tol, _fp32):
    assert load_recorded(name).memory_bandwidth_gbps == pytest.approx(gbps, rel=0.03)


@pytest.mark.parametrize(("name", "_gbps", "tflops", "tol", "_fp32"), DATASHEETS)
def test_tensor_peak_matches_datasheet(name, _gbps, tflops, tol, _fp32):
    assert load_recorded(name).tensor_tflops == pytest.approx(tflops, rel=tol)


@pytest.mark.parametrize(("name", "_gbps", "_tf", "_tol", "fp32"), DATASHEETS)
def test_fp32_peak_matches_datasheet(name, _gbps, _tf, _tol, fp32):
    assert load_recorded(name).fp32_tflops == pytest.approx(fp32, rel=0.03)


def test_pcie_rate_per_direction_follows_generation_and_width():
    assert load_recorded("h100-sxm").pcie_gbps_per_direction == pytest.approx(63.0, rel=0.01)
    assert load_recorded("t4").pcie_gbps_per_direction == pytest.approx(15.75, rel=0.01)


def test_every_derived_number_is_marked_as_estimated():
    device = load_recorded("l4")
    for key in ("memory_bandwidth_gbps", "fp32_tflops", "tensor_tflops", "pcie_gbps_per_direction"):
        assert key in device.estimated


def test_sm_count_is_derived_from_cores_when_nvml_gives_only_cores():
    device = load_recorded("h100-sxm")
    assert device.sm_count == 132
    assert "sm_count" in device.estimated


def test_cores_are_derived_from_sms_when_cores_are_not_supported():
    device = load_recorded("t4")
    assert device.cuda_cores == 2560
    assert "cuda_cores" in device.estimated


def test_geforce_clock_is_scaled_down_from_the_nvml_ceiling():
    device = load_recorded("rtx-4090")
    assert device.max_sm_clock_mhz == 3105
    assert device.boost_sm_clock_mhz == pytest.approx(2520, rel=0.01)


def test_unknown_cores_and_sms_leave_flops_unknown(record):
    raw = record("l4")
    raw["answers"]["num_gpu_cores"] = None
    device = derive_gpu(raw)
    assert device.fp32_tflops is None
    assert device.tensor_tflops is None
    assert device.memory_bandwidth_gbps is not None


def test_architecture_comes_from_compute_capability_when_nvml_does_not_say(record):
    raw = record("a100-40gb-sxm")
    raw["answers"]["architecture"] = None
    assert derive_gpu(raw).architecture == "ampere"


def test_nvlink_links_are_counted_and_absent_nvlink_is_unknown():
    assert load_recorded("h100-sxm").nvlink_active == 18
    assert load_recorded("l4").nvlink_links is None


def test_power_limit_is_in_watts():
    assert load_recorded("t4").power_limit_w == 70.0
