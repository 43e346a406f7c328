"""How `up --cluster` starts a service on a host of the cluster file
(`grpo_stream.config.cluster`): the hub and trainer addresses it binds and advertises, and
the launcher command that wraps a service's argv.

Invariants: the hub and the first trainer host bind an address the other hosts reach and
advertise `address`; `up` learns the hub's address from its `hub.started` event (no shared
run directory needed for that); a service started through `ssh` or `slurm` gets what it reads
from `up`'s machine (the secret, its role's CURVE keys, the hub's config) as a tar stream on
the launcher's stdin, unpacked into RUN_DIR/private/INSTANCE on its host before it starts
(grpo_stream.launch.receive): no shared filesystem, nothing secret on a command line; `local`
and `prefix` hosts are this machine and read the files where they are; hosts with launcher
"ray" are Ray nodes, started by grpo_stream.launch.ray.runner, which ships those files itself.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from grpo_stream.config.cluster import ClusterFile, ClusterHost
from grpo_stream.launch.shipping import Pending, private_dir, shipped_argv
from grpo_stream.launch.supervisor import ServiceSpec

SHIPPED = ("ssh", "slurm")
"""Launchers that start a service on another host: its files travel on their stdin."""
RECEIVE = ["-m", "grpo_stream.launch.receive"]


def config_overrides(cluster: ClusterFile, trainer_host: str | None = None) -> list[str]:
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


def place(
    host: ClusterHost, spec: ServiceSpec, run_dir: Path | None = None, serves: bool = False
) -> ServiceSpec:
    """The spec started through the host's launcher (its python replacing this one). With
    `run_dir`, a service on an `ssh` or `slurm` host gets its files shipped (`serves`: a
    generator that binds, and so needs the server's key pair)."""
    argv = list(spec.argv)
    if host.python and argv and argv[0] == sys.executable:
        argv[0] = host.python
    stdin: Callable[[], bytes] | None = None
    if host.launcher in SHIPPED and run_dir is not None:
        directory = private_dir(run_dir, spec.instance)
        stdin = Pending(spec, run_dir, serves)
        command = shipped_argv(replace(spec, argv=argv), directory)
        argv = [argv[0], *RECEIVE, directory, "--", *command]
    prefix: list[str] = []
    env = {**host.env, **spec.env}  # the spec's devices win over the host's defaults
    if host.launcher == "prefix":
        prefix = list(host.prefix)
    elif host.launcher == "slurm":
        prefix = ["srun", "--nodes=1", "--ntasks=1", "-w", host.name, "--overlap"]
        if spec.env:  # slurmstepd sets CUDA_VISIBLE_DEVICES for a step holding GPUs: after it
            prefix += ["env", *(f"{k}={v}" for k, v in sorted(spec.env.items()))]
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
        stdin=stdin,
    )
