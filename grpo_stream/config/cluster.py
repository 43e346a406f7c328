"""Cluster files: the hosts of a run, read by `grpo-stream plan` and `grpo-stream up --cluster`.

One TOML file, one model. `plan` reads each host's devices and assigns roles; `up` reads
how to start services on each host:

    model_params = "7B"            # plan: int, or a number with K, M, B or T
    trainer_devices = 1            # plan: trainer ranks
    base_credits = 16              # plan: prompts per generator at an equal share
    hub_port = 5555                # up: 0 picks a free port (the hub must bind its address)
    [hardware]                     # plan: overrides of HardwareSettings (alpha, ...)
    [[hosts]]
    name = "node-a"                # unique; devices are node-a:0, node-a:1, ...
    address = "10.0.0.1"           # what the other hosts dial
    devices = ["h100-sxm", "auto"] # recorded fingerprint names, or "auto" (this machine)
    latency_ms = 0.2               # measured hub round trip (default 0)
    bind = "0.0.0.0"               # interface hub/trainer bind here (default: address)
    launcher = "ssh"               # local | ssh | prefix | slurm (ray: made by --launcher ray)
    ssh = "me@node-a"              # ssh target (default: address)
    python = "/opt/venv/bin/python"
    services = { hub = 1, trainer = 1, generator = 1, scorer = 1 }
    gpus = { trainer = [0], generator = [1] }   # run.placement = "manual": NVML indices

`services.trainer` is the number of trainer ranks on that host: several hosts with trainer
ranks run torchrun multi-node, rendezvous on the first of them.

Invariant: a bad file raises ClusterError with one line naming the field, never a
traceback; `up` additionally needs exactly one host running the hub (`check_launch`).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from grpo_stream.config.hardware import HardwareSettings

ROLES = ("hub", "trainer", "generator", "scorer")
"""The services a host entry may run."""
_SINGLE = ("hub",)
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


class ClusterHost(BaseModel):
    """One host of the cluster: its devices (plan) and how `up` starts services there."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = Field(min_length=1)
    """Unique host name; device ids are NAME:INDEX (the Slurm node name for slurm)."""
    address: str = Field("127.0.0.1", min_length=1)
    """Where services on this host are reached (hostname or IP)."""
    devices: list[str] = Field(default_factory=lambda: ["auto"], min_length=1)
    """Recorded fingerprint names, or "auto" for every device of the machine running plan."""
    latency_ms: float = Field(default=0.0, ge=0)
    """Hub round trip from this host in milliseconds."""
    bind: str | None = None
    """Interface hub and trainer bind on this host (default: address; "0.0.0.0": all)."""
    launcher: Literal["local", "ssh", "prefix", "slurm", "ray"] = "local"
    """local: a plain process; ssh: `ssh -o BatchMode=yes TARGET -- CMD`; prefix: PREFIX CMD;
    slurm: `srun --nodes=1 --ntasks=1 -w NAME --overlap CMD`; ray: a Ray actor on the Ray node
    NAME (the hosts `up --launcher ray` makes of the Ray cluster's nodes)."""
    ssh: str | None = None
    """ssh target, user@host (default: address)."""
    prefix: list[str] = Field(default_factory=list)
    """Command prefix for the prefix launcher, e.g. ["ip", "netns", "exec", "h1"]."""
    python: str | None = None
    """Python with grpo-stream installed on that host (default: the one running `up`)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for services started here (local, prefix and slurm launchers)."""
    services: dict[str, int] = Field(default_factory=dict)
    """How many of each role run here: hub, trainer (ranks), generator, scorer."""
    gpus: dict[Literal["trainer", "generator"], list[int]] = Field(default_factory=dict)
    """run.placement = "manual": NVML indices of this host's GPUs per role."""

    @model_validator(mode="after")
    def _check(self) -> ClusterHost:
        for role, count in self.services.items():
            if role not in ROLES:
                raise ValueError(f"unknown service {role!r}: choose from {', '.join(ROLES)}")
            if count < 0 or (role in _SINGLE and count > 1):
                raise ValueError(f"services.{role} = {count} is out of range")
        if self.launcher == "prefix" and not self.prefix:
            raise ValueError("the prefix launcher needs a non-empty prefix")
        return self

    def count(self, role: str) -> int:
        return self.services.get(role, 0)


class ClusterFile(BaseModel):
    """A cluster file (TOML)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model_params: int | None = Field(None, ge=1)
    """plan: parameters of the model to train (int or "7B"); `up` takes them from the run."""
    trainer_devices: int = Field(default=1, ge=1)
    """plan: devices (ranks) for the trainer."""
    base_credits: int = Field(default=16, ge=1)
    """plan: prompts a generator may hold at an equal share (generator.prompts_per_request)."""
    hardware: HardwareSettings = HardwareSettings()
    """plan: the device score's weights."""
    hub_port: int = Field(0, ge=0, le=65535)
    """up: port of the hub; 0 picks a free one (then the hub must bind its address)."""
    hosts: list[ClusterHost] = Field(min_length=1)
    """The hosts, one [[hosts]] table each (at least one)."""

    @field_validator("model_params", mode="before")
    @classmethod
    def _params(cls, value: Any) -> int | None:
        return None if value is None else parse_params(value)

    @model_validator(mode="after")
    def _unique(self) -> ClusterFile:
        names = [h.name for h in self.hosts]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"host names must be unique: {', '.join(dupes)}")
        return self

    def check_launch(self) -> None:
        """What `up --cluster` needs beyond a valid file (ValueError with one line)."""
        for role in _SINGLE:
            where = [h.name for h in self.hosts if h.count(role)]
            if len(where) != 1:
                raise ValueError(f"exactly one host must run the {role}, found {len(where)}")
        hub = self.host_of("hub")
        if self.hub_port == 0 and hub.bind not in (None, hub.address):
            raise ValueError("a hub binding another interface than its address needs hub_port")

    def host_of(self, role: str) -> ClusterHost:
        return next(h for h in self.hosts if h.count(role))


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


def read_launch_file(path: Path) -> ClusterFile:
    """A cluster file that `up --cluster` can start (exactly one hub host, ...)."""
    cluster = read_cluster_file(path)
    try:
        cluster.check_launch()
    except ValueError as exc:
        raise ClusterError(f"invalid cluster file {path}: {exc}") from None
    return cluster
