"""Fingerprint the CPU of a host without NVML, so every host gets a score.

Cores come from the affinity mask (what this process may use, not what the board has),
memory from psutil, the model name from /proc/cpuinfo. Two micro-benchmarks, each bounded
by `seconds` (default 0.2 s, so the whole fingerprint stays under 1 s), measure what the
score needs: float32 matmul GFLOP/s and copy bandwidth (STREAM convention: bytes read +
bytes written per second). Both are listed in `DeviceFingerprint.measured` and vary run to
run by tens of percent on shared hosts.

The matmul runs stacks of 64x64 products, below OpenBLAS's threading threshold, so it
measures one core; the host's figure is that times the cores. Timing BLAS's own threads
instead collapses (5x lower, measured) when the cores are shared with other processes,
because its threads spin waiting for each other.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from grpo_stream.hardware.device import DeviceFingerprint

MATMUL_N = 64
"""Side of each product: large enough for BLAS's kernels, small enough to stay on one thread."""
MATMUL_STACK = 32
"""Products per call (one numpy call of (32, 64, 64) @ (32, 64, 64))."""
COPY_BYTES = 32 << 20
"""Bytes per copy: well past every last-level cache we expect, so the copy reaches memory."""


def cpu_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (first `model name` of /proc/cpuinfo, else the platform's)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model") and value.strip():
                return value.strip()
    except OSError:
        pass  # no /proc (macOS, containers without it): fall back below
    return platform.processor() or platform.machine() or "cpu"


def _repeat(fn: Callable[[], object], seconds: float) -> tuple[int, float]:
    """Call fn() until `seconds` pass (at least twice); return (calls, elapsed) after warm-up."""
    fn()  # warm-up: allocation, BLAS thread start
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and calls >= 2:
            return calls, elapsed


def matmul_gflops(seconds: float = 0.2) -> float:
    """Measured float32 matmul throughput of one core in GFLOP/s (2 n^3 FLOPs per product)."""
    shape = (MATMUL_STACK, MATMUL_N, MATMUL_N)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape, dtype=np.float32)
    b = rng.standard_normal(shape, dtype=np.float32)
    out = np.empty_like(a)
    calls, elapsed = _repeat(lambda: np.matmul(a, b, out=out), seconds)
    return 2 * MATMUL_STACK * MATMUL_N**3 * calls / elapsed / 1e9


def copy_gbps(seconds: float = 0.2) -> float:
    """Measured memory copy bandwidth in GB/s, counting bytes read plus bytes written."""
    src = np.ones(COPY_BYTES, dtype=np.uint8)
    dst = np.empty_like(src)
    calls, elapsed = _repeat(lambda: np.copyto(dst, src), seconds)
    return 2 * COPY_BYTES * calls / elapsed / 1e9


@dataclass(frozen=True)
class CpuRates:
    """Measured float32 matmul GFLOP/s of one core and copy bandwidth in GB/s."""

    gflops_per_core: float
    copy_gbps: float


def measure(seconds: float) -> CpuRates:
    """Run both micro-benchmarks now (about 2 x `seconds`)."""
    return CpuRates(matmul_gflops(seconds), copy_gbps(seconds))


def fingerprint_cpu(
    host: str = "", benchmark: bool = True, seconds: float = 0.2, rates: CpuRates | None = None
) -> DeviceFingerprint:
    """The CPU as one device; `benchmark=False` skips the micro-benchmarks (FLOPS unknown).
    `rates` are figures measured earlier (grpo_stream.hardware.cpu_cache), else measured now."""
    memory = psutil.virtual_memory()
    cores = cpu_cores()
    measured: dict[str, str] = {}
    gflops = gbps = None
    if benchmark:
        rates = rates or measure(seconds)
        gflops = rates.gflops_per_core * cores
        gbps = rates.copy_gbps
        measured["fp32_tflops"] = (
            f"float32 {MATMUL_N}x{MATMUL_N} matmul on one core, {seconds} s, x {cores} cores"
        )
        measured["memory_bandwidth_gbps"] = (
            f"copy of {COPY_BYTES >> 20} MiB, read + write, {seconds} s"
        )
    return DeviceFingerprint(
        kind="cpu",
        name=cpu_model(),
        index=0,
        host=host,
        memory_total_bytes=int(memory.total),
        memory_free_bytes=int(memory.available),
        cpu_cores=cores,
        memory_bandwidth_gbps=gbps,
        fp32_tflops=None if gflops is None else gflops / 1000,
        measured=measured,
    )
