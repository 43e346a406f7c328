"""Cluster files: the hosts and devices `grpo-stream plan` assigns roles to.

    model_params = "7B"            # int, or a number with K, M, B or T
    trainer_devices = 1
    base_credits = 16              # prompts per generator at an equal share
    [hardware]                     # optional overrides of HardwareSettings (alpha, ...)
    [[hosts]]
    name = "node-a"                # unique; devices are node-a:0, node-a:1, ...
    address = "10.0.0.1"
    devices = ["h100-sxm", "auto"] # recorded fingerprint names, or "auto" (this machine)
    latency_ms = 0.2               # measured hub round trip (default 0)

"auto" fingerprints the machine running the command (every device it has). Invariant: a
bad file raises ClusterError with one line naming the field, never a traceback.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from grpo_stream.hardware.device import DeviceFingerprint
from grpo_stream.hardware.settings import HardwareSettings

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


class ClusterError(ValueError):
    """A cluster file is invalid; the message is one line."""


def parse_params(value: Any) -> int:
    """7000000, "7M", "1.5B" -> a parameter count."""
    if isinstance(value, bool):
        raise ValueError("expected a parameter count")
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMBT]?)\s*", str(value), re.IGNORECASE)
    if match is None:
        raise ValueError(f"expected a parameter count like 7000000 or '7B', got {value!r}")
    return round(float(match.group(1)) * _SUFFIX[match.group(2).upper()])


LAUNCH_HOST_KEYS = frozenset(
    {"bind", "launcher", "ssh", "prefix", "python", "env", "services", "gpus"}
)
"""Keys of a host entry that say how `up --cluster` starts services there (not the plan's)."""
LAUNCH_TOP_KEYS = frozenset({"hub_port"})


class HostEntry(BaseModel):
    """One host of the cluster."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _drop_launch_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in LAUNCH_HOST_KEYS}
        return data

    name: str = Field(min_length=1)
    """Unique host name; device ids are NAME:INDEX."""
    address: str = Field(min_length=1)
    """Where services on this host are reached (hostname or IP)."""
    devices: list[str] = Field(default_factory=lambda: ["auto"], min_length=1)
    """Recorded fingerprint names, or "auto" for every device of the machine running plan."""
    latency_ms: float = Field(default=0.0, ge=0)
    """Hub round trip from this host in milliseconds."""


class ClusterFile(BaseModel):
    """A cluster file (TOML)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _drop_launch_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in LAUNCH_TOP_KEYS}
        return data

    model_params: int = Field(ge=1)
    """Parameters of the model to train (int or "7B")."""
    trainer_devices: int = Field(default=1, ge=1)
    """Devices (ranks) for the trainer."""
    base_credits: int = Field(default=16, ge=1)
    """Prompts a generator may hold at an equal share (generator.prompts_per_request)."""
    hardware: HardwareSettings = HardwareSettings()
    hosts: list[HostEntry] = Field(min_length=1)

    @field_validator("model_params", mode="before")
    @classmethod
    def _params(cls, value: Any) -> int:
        return parse_params(value)

    @model_validator(mode="after")
    def _unique(self) -> ClusterFile:
        names = [h.name for h in self.hosts]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"host names must be unique: {', '.join(dupes)}")
        return self


@dataclass(frozen=True)
class Cluster:
    """A resolved cluster file: fingerprints and what plan_roles needs besides."""

    spec: ClusterFile
    devices: list[DeviceFingerprint]
    latency_s: dict[str, float]


def _format(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "file"
    return f"{where}: {first['msg']}"


def read_cluster_file(path: Path) -> ClusterFile:
    """Parse and validate; ClusterError with one line on any problem."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ClusterError(f"cluster file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ClusterError(f"cannot read cluster file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ClusterError(f"invalid TOML in {path}: {exc}") from None
    try:
        return ClusterFile.model_validate(data)
    except ValidationError as exc:
        raise ClusterError(f"invalid cluster file {path}: {_format(exc)}") from None


def host_devices(
    host: HostEntry, position: int, live: Callable[[], list[DeviceFingerprint]] | None = None
) -> list[DeviceFingerprint]:
    """The devices of one host entry: recordings by name, this machine's for "auto" (`live`
    reads them; default: every device `fingerprint_host` finds, benchmarked)."""
    from grpo_stream.hardware.fingerprint import fingerprint_host
    from grpo_stream.hardware.recorded import load_recorded

    out: list[DeviceFingerprint] = []
    for slot, name in enumerate(host.devices):
        if name == "auto":
            found = live() if live else fingerprint_host(benchmark=True).devices
            out.extend(
                dataclasses.replace(d, host=host.name, index=len(out) + i)
                for i, d in enumerate(found)
            )
            continue
        try:
            out.append(load_recorded(name, host=host.name, index=len(out)))
        except KeyError as exc:
            raise ClusterError(f"hosts.{position}.devices.{slot}: {exc.args[0]}") from None
    return out


def load_cluster(path: Path) -> Cluster:
    """Read a cluster file and fingerprint its devices (recordings, or this machine for auto)."""
    spec = read_cluster_file(path)
    devices: list[DeviceFingerprint] = []
    latency: dict[str, float] = {}
    for position, host in enumerate(spec.hosts):
        for device in host_devices(host, position):
            devices.append(device)
            latency[device.device_id] = host.latency_ms / 1000
    return Cluster(spec=spec, devices=devices, latency_s=latency)
