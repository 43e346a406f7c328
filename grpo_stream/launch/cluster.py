"""Cluster launch: which host runs which service, and how `up` starts a command there.

The same TOML file as `grpo-stream plan` (grpo_stream.hardware.cluster): `plan` reads the
devices of each `[[hosts]]` entry, `up --cluster` reads how to start services there:

    hub_port = 5555                    # 0: a free port (the hub host must then bind its IP)
    [[hosts]]
    name = "node-a"
    address = "10.0.0.1"               # what the other hosts dial
    bind = "0.0.0.0"                   # interface hub/trainer bind here (default: address)
    launcher = "ssh"                   # local | ssh | prefix | slurm
    ssh = "me@node-a"                  # ssh target (default: address)
    python = "/opt/venv/bin/python"    # interpreter with grpo-stream on that host
    services = { hub = 1, trainer = 1, generator = 1, scorer = 1 }
    gpus = { trainer = [0], generator = [1] }   # run.placement = "manual": NVML indices

`services.trainer` is the number of trainer ranks on that host: several hosts with trainer
ranks run torchrun multi-node, rendezvous on the first of them (grpo_stream.launch.placed).

Invariants: exactly one host runs the hub; the hub and the first trainer host bind an
address the other hosts reach and advertise `address`; the hub's host shares the run
directory with the machine running `up` (it reads RUN_DIR/hub.addr there); every host reads
the run's secret at the path `up` gives (`--secret-file RUN_DIR/secret`: a shared run
directory), or its services exit with one line naming the file. A bad file raises
ClusterError with one line naming the field.
"""

from __future__ import annotations

import json
import shlex
import sys
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from grpo_stream.hardware.cluster import ClusterError, ClusterFile, HostEntry
from grpo_stream.launch.supervisor import ServiceSpec

ROLES = ("hub", "trainer", "generator", "scorer")
_SINGLE = ("hub",)
# keys that only `grpo-stream plan` reads: accepted here and ignored
_PLAN_TOP = set(ClusterFile.model_fields) - {"hosts"}
_PLAN_HOST = set(HostEntry.model_fields) - {"name", "address"}


class LaunchHost(BaseModel):
    """How `up` starts services on one host."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """Unique host name (the Slurm node name for the slurm launcher)."""
    address: str = Field("127.0.0.1", min_length=1)
    """Address the other hosts dial to reach services on this host."""
    bind: str | None = None
    """Interface hub and trainer bind on this host (default: address; "0.0.0.0": all)."""
    launcher: Literal["local", "ssh", "prefix", "slurm"] = "local"
    """local: a plain process; ssh: `ssh -o BatchMode=yes TARGET -- CMD`; prefix: PREFIX CMD;
    slurm: `srun --nodes=1 --ntasks=1 -w NAME --overlap CMD`."""
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
    def _check(self) -> LaunchHost:
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


class LaunchCluster(BaseModel):
    """The launch part of a cluster file."""

    model_config = ConfigDict(extra="forbid")

    hub_port: int = Field(0, ge=0, le=65535)
    """Port of the hub; 0 picks a free one (then the hub must bind its address, not 0.0.0.0)."""
    hosts: list[LaunchHost] = Field(min_length=1)

    @model_validator(mode="after")
    def _placement(self) -> LaunchCluster:
        names = [h.name for h in self.hosts]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"host names must be unique: {', '.join(dupes)}")
        for role in _SINGLE:
            where = [h.name for h in self.hosts if h.count(role)]
            if len(where) != 1:
                raise ValueError(f"exactly one host must run the {role}, found {len(where)}")
        hub = self.host_of("hub")
        if self.hub_port == 0 and hub.bind not in (None, hub.address):
            raise ValueError("a hub binding another interface than its address needs hub_port")
        return self

    def host_of(self, role: str) -> LaunchHost:
        return next(h for h in self.hosts if h.count(role))


def read_launch_file(path: Path) -> LaunchCluster:
    """Parse the launch part of a cluster file; ClusterError with one line on any problem."""
    try:
        data: dict[str, Any] = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ClusterError(f"cluster file not found: {path}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ClusterError(f"cannot read cluster file {path}: {exc}") from None
    data = {k: v for k, v in data.items() if k not in _PLAN_TOP}
    hosts = data.get("hosts")
    if isinstance(hosts, list):
        data["hosts"] = [
            {k: v for k, v in h.items() if k not in _PLAN_HOST} if isinstance(h, dict) else h
            for h in hosts
        ]
    try:
        return LaunchCluster.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "file"
        raise ClusterError(f"invalid cluster file {path}: {where}: {first['msg']}") from None


def config_overrides(cluster: LaunchCluster, trainer_host: str | None = None) -> list[str]:
    """`--set` overrides so hub and trainer (rank 0: the first trainer host, or
    `trainer_host` where placement put it) bind reachable interfaces and advertise them."""
    hub = cluster.host_of("hub")
    named = [h for h in cluster.hosts if h.name == trainer_host or h.count("trainer")]
    trainer = next((h for h in named if h.name == trainer_host), named[0] if named else hub)
    hub_bind = hub.bind or hub.address
    out = [f"hub.bind={json.dumps(f'tcp://{hub_bind}:{cluster.hub_port}')}"]
    if hub_bind != hub.address:
        out.append(f"hub.public_address={json.dumps(f'tcp://{hub.address}:{cluster.hub_port}')}")
    out.append(f"trainer.bind={json.dumps(f'tcp://{trainer.bind or trainer.address}:0')}")
    out.append(f"trainer.public_host={json.dumps(trainer.address)}")
    return out


def place(host: LaunchHost, spec: ServiceSpec) -> ServiceSpec:
    """The spec started through the host's launcher (its python replacing this one)."""
    argv = list(spec.argv)
    if host.python and argv and argv[0] == sys.executable:
        argv[0] = host.python
    prefix: list[str] = []
    env = {**host.env, **spec.env}  # the spec's devices win over the host's defaults
    if host.launcher == "prefix":
        prefix = list(host.prefix)
    elif host.launcher == "slurm":
        prefix = ["srun", "--nodes=1", "--ntasks=1", "-w", host.name, "--overlap"]
    elif host.launcher == "ssh":
        exports = [f"{k}={v}" for k, v in sorted({**host.env, **spec.env}.items())]
        remote = ["env", *exports, *argv] if exports else argv
        prefix = ["ssh", "-o", "BatchMode=yes", host.ssh or host.address, "--"]
        argv = [shlex.join(remote)]  # ssh hands the remote shell one command line
        env = {}
    return ServiceSpec(
        spec.instance,
        spec.service,
        argv,
        host=host.name,
        prefix=prefix,
        env=env,
        restarts_left=spec.restarts_left,
    )
