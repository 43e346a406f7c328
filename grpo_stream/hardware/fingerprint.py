"""Fingerprint this host: every GPU through NVML, or the CPU when NVML is unavailable.

`fingerprint_host` never raises for missing hardware: no driver, no library, or no GPU
gives a CPU fingerprint with `nvml_error` saying why. Services call it once at start and
put `.to_dict()` into their Hello.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import structlog

from grpo_stream.hardware.cpu import fingerprint_cpu
from grpo_stream.hardware.cpu_cache import host_rates
from grpo_stream.hardware.device import HostFingerprint
from grpo_stream.hardware.nvml import NvmlUnavailable, read_nvml
from grpo_stream.hardware.specs import derive_gpu

log = structlog.get_logger()


def fingerprint_host(
    benchmark: bool = True, nvml: Any = None, seconds: float = 0.2, cache: Path | None = None
) -> HostFingerprint:
    """Every device of this host. `nvml` replaces the pynvml module (tests, recordings).

    `benchmark` runs the CPU micro-benchmarks when there is no GPU (about 2 x `seconds`);
    with a `cache` file they are measured once per boot and shared by every process of the
    host (grpo_stream.hardware.cpu_cache), so all its generators report the same device.
    """
    host = socket.gethostname()
    try:
        raw = read_nvml(nvml)
    except NvmlUnavailable as exc:
        log.debug("fingerprint.cpu", reason=exc.error)  # expected on a CPU host
        return _cpu_host(host, benchmark, seconds, exc.error, cache)
    if not raw["devices"]:
        log.debug("fingerprint.cpu", reason="no NVML devices")
        return _cpu_host(host, benchmark, seconds, "no NVML devices", cache)
    devices = [derive_gpu(d, index=i, host=host) for i, d in enumerate(raw["devices"])]
    unknown = {d.index: sorted(d.raw["errors"]) for d in devices if d.raw and d.raw["errors"]}
    log.info("fingerprint.nvml", devices=len(devices), unanswered=unknown)
    return HostFingerprint(
        hostname=host,
        source="nvml",
        devices=devices,
        driver_version=raw["driver_version"],
        cuda_driver_version=raw["cuda_driver_version"],
    )


def _cpu_host(
    host: str, benchmark: bool, seconds: float, why: str, cache: Path | None
) -> HostFingerprint:
    rates = None
    if benchmark and cache is not None:
        rates = host_rates(seconds, cache)
    device = fingerprint_cpu(host=host, benchmark=benchmark, seconds=seconds, rates=rates)
    return HostFingerprint(hostname=host, source="cpu", devices=[device], nvml_error=why)
