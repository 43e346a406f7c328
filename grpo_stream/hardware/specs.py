"""Derive peak FLOPS, memory bandwidth and PCIe rate from raw NVML answers.

Every derived number is an estimate of a datasheet peak and is marked as such in
`DeviceFingerprint.estimated`; a missing input makes the output None, never a guess.

Memory bandwidth = max memory clock x 2 x bus width / 8. NVML already reports the memory
clock so that x 2 gives the per-pin data rate for every memory type checked, so the
data-rate factor is 2 for HBM2, HBM2e, HBM3, HBM3e, GDDR6, GDDR6X and GDDR7. Calibration
(NVML max memory clock, bus width -> estimate vs datasheet):
    H100 SXM  2619 MHz x 5120 b -> 3352 GB/s  (3350)     A100 40GB  1215 x 5120 -> 1555 (1555)
    H200      3201 MHz x 6144 b -> 4917 GB/s  (4800)     V100 SXM2   877 x 4096 ->  898  (900)
    L4        6251 MHz x  192 b ->  300 GB/s  (300)      A10        6251 x  384 ->  600  (600)
    RTX 4090 10501 MHz x  384 b -> 1008 GB/s  (1008)     T4         5001 x  256 ->  320  (320)
    RTX 4060 Ti 9001 MHz x 128 b -> 288 GB/s  (288)

FP32 peak = CUDA cores x 2 (FMA) x SM clock. Tensor peak = SMs x dense FLOPs per clock per
SM (table below, half-precision inputs with FP32 accumulate: bf16 from Ampere on, fp16 on
Volta and Turing, which have no bf16) x SM clock. Calibration (SMs x FLOPs/clk/SM x clock):
    V100 SXM2  80 x 1024 x 1.530 GHz = 125 TFLOPS (125)   T4  40 x 1024 x 1.590 =  65 (65)
    A100      108 x 2048 x 1.410 GHz = 312 TFLOPS (312)   A10 72 x 1024 x 1.695 = 125 (125)
    L4         58 x 1024 x 2.040 GHz = 121 TFLOPS (121)   H100 SXM 132 x 4096 x 1.980 = 1070
H100 SXM's datasheet 989 TFLOPS assumes 1830 MHz while NVML's boost clock is 1980 MHz, so
the estimate is 8% above the datasheet. Blackwell (sm_100) doubles Hopper's per-SM rate
(B200: 2.25 PFLOPS dense); sm_120 parts (RTX 50, RTX PRO) run at Ada's per-SM rate.

GeForce parts run half-precision tensor math with FP32 accumulate at half rate (RTX 4090:
128 x 512 x 2.52 GHz = 165 TFLOPS dense), and NVML gives them no customer boost clock:
their max SM clock (3105 MHz on Ada) is the voltage-frequency ceiling, not the rated
boost clock datasheet peaks use (2520 MHz on the 4090, 2535 on the 4060 Ti), so their
clock is scaled by RATED_BOOST_FRACTION = 0.81. Every other part uses NVML's customer boost
clock, or its max SM clock when that is unknown.
"""

from __future__ import annotations

from typing import Any

from grpo_stream.hardware.device import DeviceFingerprint

MEMORY_DATA_RATE = 2
"""Transfers per NVML memory clock (see the calibration in the module docstring)."""

RATED_BOOST_FRACTION = 0.81
"""Rated boost clock / NVML max SM clock on GeForce parts (2520/3105 and 2535/3105 on Ada)."""

ARCHITECTURES = {5: "volta", 6: "turing", 7: "ampere", 8: "ada", 9: "hopper", 10: "blackwell"}
"""NVML's nvmlDeviceArchitecture_t values."""

_ARCH_BY_CC = {
    (7, 0): "volta",
    (7, 2): "volta",
    (7, 5): "turing",
    (8, 0): "ampere",
    (8, 6): "ampere",
    (8, 7): "ampere",
    (8, 9): "ada",
    (9, 0): "hopper",
    (10, 0): "blackwell",
    (10, 3): "blackwell",
    (12, 0): "blackwell",
    (12, 1): "blackwell",
}

CORES_PER_SM = {
    (7, 0): 64,
    (7, 2): 64,
    (7, 5): 64,
    (8, 0): 64,
    (8, 6): 128,
    (8, 7): 128,
    (8, 9): 128,
    (9, 0): 128,
    (10, 0): 128,
    (10, 3): 128,
    (12, 0): 128,
    (12, 1): 128,
}
"""FP32 CUDA cores per SM, by compute capability."""

TENSOR_FLOPS_PER_CLOCK_PER_SM = {
    (7, 0): 1024,
    (7, 2): 1024,
    (7, 5): 1024,
    (8, 0): 2048,
    (8, 6): 1024,
    (8, 7): 1024,
    (8, 9): 1024,
    (9, 0): 4096,
    (10, 0): 8192,
    (10, 3): 8192,
    (12, 0): 1024,
    (12, 1): 1024,
}
"""Dense half-precision tensor FLOPs per clock per SM (FP32 accumulate, non-GeForce)."""

PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
"""GB/s per lane per direction: GT/s x encoding (8b/10b to gen 2, 128b/130b, gen 6 FLIT)."""


def _cc(answers: dict[str, Any]) -> tuple[int, int] | None:
    cc = answers.get("cuda_compute_capability")
    return None if cc is None else (int(cc[0]), int(cc[1]))


def _architecture(answers: dict[str, Any], cc: tuple[int, int] | None) -> str | None:
    arch = answers.get("architecture")
    if arch in ARCHITECTURES:
        return ARCHITECTURES[arch]
    return None if cc is None else _ARCH_BY_CC.get(cc)


def _sm_clock(answers: dict[str, Any], name: str, est: dict[str, str]) -> int | None:
    """The clock peak FLOPS are quoted at (see the module docstring)."""
    boost, top = answers.get("max_customer_boost_sm_mhz"), answers.get("max_clock_sm_mhz")
    if boost is not None:
        return int(boost)
    if top is None:
        return None
    if "geforce" in name.lower():
        est["boost_sm_clock_mhz"] = f"max SM clock x {RATED_BOOST_FRACTION} (GeForce V/F ceiling)"
        return round(int(top) * RATED_BOOST_FRACTION)
    return int(top)


def _cores_and_sms(
    answers: dict[str, Any], cc: tuple[int, int] | None, est: dict[str, str]
) -> tuple[int | None, int | None]:
    cores, sms = answers.get("num_gpu_cores"), answers.get("multiprocessor_count")
    if cc is None or cc not in CORES_PER_SM:
        return cores, sms
    per_sm, sm_arch = CORES_PER_SM[cc], f"sm_{cc[0]}{cc[1]}"
    if cores is not None and sms is None:
        sms = cores // per_sm
        est["sm_count"] = f"CUDA cores / {per_sm} cores per SM ({sm_arch})"
    elif sms is not None and cores is None:
        cores = sms * per_sm
        est["cuda_cores"] = f"SMs x {per_sm} cores per SM ({sm_arch})"
    return cores, sms


def _bandwidth(answers: dict[str, Any], est: dict[str, str]) -> float | None:
    clock, width = answers.get("max_clock_mem_mhz"), answers.get("memory_bus_width_bits")
    if clock is None or width is None:
        return None
    est["memory_bandwidth_gbps"] = f"max memory clock x {MEMORY_DATA_RATE} x bus width / 8"
    return float(clock) * 1e6 * MEMORY_DATA_RATE * int(width) / 8 / 1e9


def _tensor_tflops(
    sms: int | None, clock: int | None, cc: tuple[int, int] | None, name: str, est: dict[str, str]
) -> float | None:
    per_clock = None if cc is None else TENSOR_FLOPS_PER_CLOCK_PER_SM.get(cc)
    if sms is None or clock is None or per_clock is None:
        return None
    note = ""
    if "geforce" in name.lower():
        per_clock //= 2
        note = " (GeForce: half rate with FP32 accumulate)"
    precision = "fp16" if cc is not None and cc < (8, 0) else "bf16"
    est["tensor_tflops"] = f"SMs x {per_clock} dense {precision} FLOPs/clk/SM x SM clock{note}"
    return sms * per_clock * clock * 1e6 / 1e12


def _pcie(answers: dict[str, Any], est: dict[str, str]) -> float | None:
    gen, width = answers.get("max_pcie_link_generation"), answers.get("max_pcie_link_width")
    if gen not in PCIE_GBPS_PER_LANE or width is None:
        return None
    est["pcie_gbps_per_direction"] = "lanes x GB/s per lane of the PCIe generation"
    return float(PCIE_GBPS_PER_LANE[gen] * int(width))


def derive_gpu(raw: dict[str, Any], index: int = 0, host: str = "") -> DeviceFingerprint:
    """A GPU fingerprint from one raw NVML record (see grpo_stream.hardware.nvml)."""
    answers: dict[str, Any] = raw["answers"]
    est: dict[str, str] = {}
    name = str(answers.get("name") or f"gpu{index}")
    cc = _cc(answers)
    clock = _sm_clock(answers, name, est)
    cores, sms = _cores_and_sms(answers, cc, est)
    fp32 = None
    if cores is not None and clock is not None:
        fp32 = cores * 2 * clock * 1e6 / 1e12
        est["fp32_tflops"] = "CUDA cores x 2 x SM clock"
    memory = answers.get("memory") or {}
    links = answers.get("nvlink_states")
    power = answers.get("power_limit_mw")
    return DeviceFingerprint(
        kind="gpu",
        name=name,
        index=index,
        host=host,
        uuid=answers.get("uuid"),
        memory_total_bytes=memory.get("total"),
        memory_free_bytes=memory.get("free"),
        cuda_cores=cores,
        sm_count=sms,
        max_sm_clock_mhz=answers.get("max_clock_sm_mhz"),
        boost_sm_clock_mhz=clock,
        max_mem_clock_mhz=answers.get("max_clock_mem_mhz"),
        memory_bus_width_bits=answers.get("memory_bus_width_bits"),
        compute_capability=None if cc is None else f"{cc[0]}.{cc[1]}",
        architecture=_architecture(answers, cc),
        pcie_generation=answers.get("max_pcie_link_generation"),
        pcie_width=answers.get("max_pcie_link_width"),
        nvlink_active=None if links is None else sum(1 for s in links if s),
        nvlink_links=None if links is None else len(links),
        power_limit_w=None if power is None else power / 1000,
        memory_bandwidth_gbps=_bandwidth(answers, est),
        fp32_tflops=fp32,
        tensor_tflops=_tensor_tflops(sms, clock, cc, name, est),
        pcie_gbps_per_direction=_pcie(answers, est),
        estimated=est,
        raw=raw,
    )
