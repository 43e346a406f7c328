"""Recorded fingerprints, and an NVML stand-in that answers from them.

grpo_stream/hardware/recorded/NAME.json holds one device's raw NVML record, the shape
`nvml.read_device` produces: {"answers": {...}, "errors": {...}} plus a "note" saying where
the values come from. `RecordedNvml` replays such records through the same reader the live
path uses (raising pynvml's own error classes where an error is recorded), so a recorded
device and a live one are derived by the same code.
"""

from __future__ import annotations

import json
from importlib import resources
from types import SimpleNamespace
from typing import Any, NoReturn

import pynvml

from grpo_stream.hardware.device import DeviceFingerprint
from grpo_stream.hardware.nvml import read_nvml
from grpo_stream.hardware.specs import derive_gpu

NVLINK_MAX_LINKS = 18


class RecordedNvml:
    """A pynvml-like object: the subset of NVML calls the reader makes, answered from records.

    An answer that is None with no recorded error raises NVMLError_NotSupported; a record's
    error raises that error class. `init_error` (e.g. "NVMLError_DriverNotLoaded") makes
    `nvmlInit` fail the way a host without a driver does.
    """

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_NVLINK_MAX_LINKS = NVLINK_MAX_LINKS

    def __init__(
        self,
        devices: list[dict[str, Any]],
        driver_version: str | None = "570.00",
        cuda_driver_version: int | None = 12080,
        init_error: str | None = None,
    ) -> None:
        self._pynvml = pynvml  # the real module: its error classes, even while this one stands in
        self.NVMLError = pynvml.NVMLError
        self._devices = devices
        self._driver, self._cuda = driver_version, cuda_driver_version
        self._init_error = init_error
        self.initialised = False

    def _raise(self, error: str) -> NoReturn:
        raise getattr(self._pynvml, error)()

    def _answer(self, handle: int, key: str) -> Any:
        record = self._devices[handle]
        if key in record["errors"]:
            self._raise(record["errors"][key])
        value = record["answers"].get(key)
        if value is None:
            self._raise("NVMLError_NotSupported")
        return value

    def nvmlInit(self) -> None:
        if self._init_error is not None:
            self._raise(self._init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        if self._driver is None:
            self._raise("NVMLError_NotSupported")
        return str(self._driver)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        if self._cuda is None:
            self._raise("NVMLError_NotSupported")
        return int(self._cuda)

    def nvmlDeviceGetCount(self) -> int:
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self._devices):
            self._raise("NVMLError_InvalidArgument")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self._answer(handle, "name"))

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return str(self._answer(handle, "uuid"))

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(**self._answer(handle, "memory"))

    def nvmlDeviceGetNumGpuCores(self, handle: int) -> int:
        return int(self._answer(handle, "num_gpu_cores"))

    def nvmlDeviceGetAttributes(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(multiprocessorCount=self._answer(handle, "multiprocessor_count"))

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock: int) -> int:
        key = {self.NVML_CLOCK_SM: "max_clock_sm_mhz", self.NVML_CLOCK_MEM: "max_clock_mem_mhz"}
        if clock not in key:
            self._raise("NVMLError_InvalidArgument")
        return int(self._answer(handle, key[clock]))

    def nvmlDeviceGetMaxCustomerBoostClock(self, handle: int, clock: int) -> int:
        if clock != self.NVML_CLOCK_SM:
            self._raise("NVMLError_NotSupported")
        return int(self._answer(handle, "max_customer_boost_sm_mhz"))

    def nvmlDeviceGetMemoryBusWidth(self, handle: int) -> int:
        return int(self._answer(handle, "memory_bus_width_bits"))

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        major, minor = self._answer(handle, "cuda_compute_capability")
        return int(major), int(minor)

    def nvmlDeviceGetArchitecture(self, handle: int) -> int:
        return int(self._answer(handle, "architecture"))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return int(self._answer(handle, "max_pcie_link_generation"))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return int(self._answer(handle, "max_pcie_link_width"))

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        states = self._answer(handle, "nvlink_states")
        if link >= len(states):
            self._raise("NVMLError_InvalidArgument")
        return int(states[link])

    def nvmlDeviceGetPowerManagementLimit(self, handle: int) -> int:
        return int(self._answer(handle, "power_limit_mw"))


def recorded_names() -> list[str]:
    """Names of the recorded fingerprints (usable in a cluster file's `devices`)."""
    folder = resources.files("grpo_stream.hardware") / "recorded"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_record(name: str) -> dict[str, Any]:
    """The raw NVML record of a recorded device; KeyError names the known ones."""
    path = resources.files("grpo_stream.hardware") / "recorded" / f"{name}.json"
    if not path.is_file():
        raise KeyError(f"no recorded fingerprint {name!r} (known: {', '.join(recorded_names())})")
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def load_recorded(name: str, host: str = "", index: int = 0) -> DeviceFingerprint:
    """A recorded device, read through the NVML reader and derived like a live one."""
    raw = read_nvml(RecordedNvml([load_record(name)]))["devices"][0]
    return derive_gpu(raw, index=index, host=host)
