"""What a fingerprint says about a device and a host, as plain JSON-able records.

Invariants: a value the device would not tell (NVML NotSupported, MIG, no permission) is
None, never a guess; every derived number (peak FLOPS, bandwidth, PCIe rate) names how it
was obtained in `estimated` (or `measured` for CPU micro-benchmarks), so a reader can tell
datasheet-grade estimates from measurements. `to_dict` / `from_dict` round-trip exactly
through JSON and msgpack (only str, int, float, bool, None, lists and dicts).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

DeviceKind = Literal["gpu", "cpu"]


@dataclass(frozen=True)
class DeviceFingerprint:
    """One accelerator (or the CPU, when there is none) and its derived performance numbers."""

    kind: DeviceKind
    name: str
    index: int = 0
    host: str = ""
    uuid: str | None = None
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    # GPU answers (None where NVML did not say)
    cuda_cores: int | None = None
    sm_count: int | None = None
    max_sm_clock_mhz: int | None = None
    boost_sm_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    memory_bus_width_bits: int | None = None
    compute_capability: str | None = None
    architecture: str | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    nvlink_active: int | None = None
    nvlink_links: int | None = None
    power_limit_w: float | None = None
    # CPU answers
    cpu_cores: int | None = None
    # derived or measured
    memory_bandwidth_gbps: float | None = None
    fp32_tflops: float | None = None
    tensor_tflops: float | None = None
    pcie_gbps_per_direction: float | None = None
    estimated: dict[str, str] = field(default_factory=dict)
    """Derived key -> how it was estimated (formula or table)."""
    measured: dict[str, str] = field(default_factory=dict)
    """Measured key -> which micro-benchmark produced it."""
    raw: dict[str, Any] | None = None
    """The raw NVML answers and errors this record was derived from (None for a CPU)."""

    @property
    def device_id(self) -> str:
        """Stable id within a cluster: `host:index` (the UUID is not known for recordings)."""
        return f"{self.host}:{self.index}"

    @property
    def compute_tflops(self) -> float | None:
        """The compute feature of the score: bf16 tensor peak, else FP32 (CPU: measured matmul)."""
        return self.tensor_tflops if self.tensor_tflops is not None else self.fp32_tflops

    @property
    def memory_gib(self) -> float | None:
        return None if self.memory_total_bytes is None else self.memory_total_bytes / 2**30

    def to_dict(self, raw: bool = False) -> dict[str, Any]:
        """A JSON-able dict; `raw=True` keeps the NVML answers (for recording)."""
        out = asdict(self)
        if not raw:
            out.pop("raw")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceFingerprint:
        """Rebuild from `to_dict` output; unknown keys are an error (a newer peer's record)."""
        known = {f.name for f in fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise ValueError(f"unknown device fingerprint fields: {', '.join(extra)}")
        return cls(**data)


@dataclass(frozen=True)
class HostFingerprint:
    """Every device of one host; what a service puts in its Hello (`to_dict()`)."""

    hostname: str
    source: Literal["nvml", "cpu"]
    devices: list[DeviceFingerprint]
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    nvml_error: str | None = None
    """Why NVML was not used (e.g. NVMLError_LibraryNotFound), when source is cpu."""

    def to_dict(self, raw: bool = False) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "source": self.source,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "nvml_error": self.nvml_error,
            "devices": [d.to_dict(raw=raw) for d in self.devices],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostFingerprint:
        return cls(
            hostname=str(data["hostname"]),
            source=data["source"],
            devices=[DeviceFingerprint.from_dict(d) for d in data["devices"]],
            driver_version=data.get("driver_version"),
            cuda_driver_version=data.get("cuda_driver_version"),
            nvml_error=data.get("nvml_error"),
        )
