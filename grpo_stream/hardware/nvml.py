"""Read GPUs through NVML (nvidia-ml-py) into raw, JSON-able answers.

The reader asks each device a fixed list of questions and records the answer, or None
and the NVML error class name when the device will not answer (NotSupported on a part
without the feature, MIG, NoPermission, FunctionNotFound on an old driver, ...). A failed
question never stops the others and never raises: only `nvmlInit` failing (no driver, no
library) makes `read_nvml` raise `NvmlUnavailable`, so the caller can fall back to the CPU.

Raw record of a device (also the shape of grpo_stream/hardware/recorded/*.json):
    {"answers": {key: value or None}, "errors": {key: "NVMLError_NotSupported", ...}}
The NVML module is passed in (real `pynvml` by default), so tests and recordings replace
NVML exactly at this boundary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

QUESTIONS = (
    "name",
    "uuid",
    "memory",
    "num_gpu_cores",
    "multiprocessor_count",
    "max_clock_sm_mhz",
    "max_customer_boost_sm_mhz",
    "max_clock_mem_mhz",
    "memory_bus_width_bits",
    "cuda_compute_capability",
    "architecture",
    "max_pcie_link_generation",
    "max_pcie_link_width",
    "nvlink_states",
    "power_limit_mw",
)
"""Every key a raw device record has in `answers` (None where the device did not answer)."""


class NvmlUnavailable(RuntimeError):
    """NVML could not be initialised (no driver or library); `error` is the error class name."""

    def __init__(self, error: str) -> None:
        super().__init__(f"NVML unavailable: {error}")
        self.error = error


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _memory(nvml: Any, handle: Any) -> dict[str, int]:
    info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return {"total": int(info.total), "free": int(info.free), "used": int(info.used)}


def _nvlink_states(nvml: Any, handle: Any) -> list[int]:
    """States of links 0.. until the first link the device does not have.

    Link 0 failing means no NVLink at all: that error propagates (recorded as unknown).
    """
    states = [int(nvml.nvmlDeviceGetNvLinkState(handle, 0))]
    for link in range(1, int(nvml.NVML_NVLINK_MAX_LINKS)):
        try:
            states.append(int(nvml.nvmlDeviceGetNvLinkState(handle, link)))
        except nvml.NVMLError:
            break  # past the last link of this device
    return states


def _questions(nvml: Any) -> dict[str, Callable[[Any], Any]]:
    sm, mem = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM
    return {
        "name": lambda h: _text(nvml.nvmlDeviceGetName(h)),
        "uuid": lambda h: _text(nvml.nvmlDeviceGetUUID(h)),
        "memory": lambda h: _memory(nvml, h),
        "num_gpu_cores": lambda h: int(nvml.nvmlDeviceGetNumGpuCores(h)),
        "multiprocessor_count": lambda h: int(nvml.nvmlDeviceGetAttributes(h).multiprocessorCount),
        "max_clock_sm_mhz": lambda h: int(nvml.nvmlDeviceGetMaxClockInfo(h, sm)),
        "max_customer_boost_sm_mhz": lambda h: int(nvml.nvmlDeviceGetMaxCustomerBoostClock(h, sm)),
        "max_clock_mem_mhz": lambda h: int(nvml.nvmlDeviceGetMaxClockInfo(h, mem)),
        "memory_bus_width_bits": lambda h: int(nvml.nvmlDeviceGetMemoryBusWidth(h)),
        "cuda_compute_capability": lambda h: list(nvml.nvmlDeviceGetCudaComputeCapability(h)),
        "architecture": lambda h: int(nvml.nvmlDeviceGetArchitecture(h)),
        "max_pcie_link_generation": lambda h: int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        "max_pcie_link_width": lambda h: int(nvml.nvmlDeviceGetMaxPcieLinkWidth(h)),
        "nvlink_states": lambda h: _nvlink_states(nvml, h),
        "power_limit_mw": lambda h: int(nvml.nvmlDeviceGetPowerManagementLimit(h)),
    }


def read_device(nvml: Any, handle: Any) -> dict[str, Any]:
    """Ask one device every question; an NVML error is recorded, never raised."""
    answers: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for key, ask in _questions(nvml).items():
        try:
            answers[key] = ask(handle)
        except nvml.NVMLError as exc:
            answers[key] = None
            errors[key] = type(exc).__name__
    return {"answers": answers, "errors": errors}


def _ask_system(nvml: Any, ask: Callable[[], Any]) -> Any:
    try:
        return ask()
    except nvml.NVMLError:
        return None


def read_nvml(nvml: Any = None) -> dict[str, Any]:
    """Raw answers of every GPU: {"driver_version", "cuda_driver_version", "devices": [...]}.

    `nvml` is the NVML module (default: `import pynvml`). Raises NvmlUnavailable when
    NVML cannot start (no driver: LibraryNotFound / DriverNotLoaded) or lists no device.
    """
    if nvml is None:
        import pynvml

        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(type(exc).__name__) from None
    try:
        driver = _ask_system(nvml, nvml.nvmlSystemGetDriverVersion)
        count = int(nvml.nvmlDeviceGetCount())
        devices = [read_device(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        return {
            "driver_version": None if driver is None else _text(driver),
            "cuda_driver_version": _ask_system(nvml, nvml.nvmlSystemGetCudaDriverVersion),
            "devices": devices,
        }
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(type(exc).__name__) from None
    finally:
        # shutting down a half-started library has nothing left to release
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
