"""The services of a run as `up` starts them: a placement turned into ServiceSpecs, and the
dry-run table (host, device environment, command line) that `up --dry-run` and `plan` print.

Trainer nodes: one node runs `trainer.ranks` processes under torchrun --standalone (or one
plain process); several nodes run torchrun multi-node, static rendezvous at
`--master-addr` (the first trainer host's address) : `trainer.rendezvous_port`, node 0
holding global rank 0 (the rank that binds the weight server there). Every other node first
waits for that address (grpo_stream.launch.rendezvous), so an unreachable first host is one
line naming host and port, not torchrun's retries.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from grpo_stream.config import RunConfig
from grpo_stream.config.cluster import ClusterFile, ClusterHost
from grpo_stream.envs.registry import generator_rewards
from grpo_stream.launch.cluster import config_overrides, place
from grpo_stream.launch.placement import DEVICE_ORDER, Placement, Slot
from grpo_stream.launch.supervisor import ServiceSpec
from grpo_stream.launch.threads import run_shares, size_scorers, size_specs
from grpo_stream.launch.up import hub_service, security_args, service_argv, teacher_count

TORCHRUN = ["-m", "torch.distributed.run"]
SAME_MACHINE = ("local", "prefix")
"""Launchers that start services on the machine running `up` (prefix: a netns, a container),
whose cores `run.torch_threads = "auto"` splits."""


def torchrun_argv(
    python: str, nodes: int, node_rank: int, ranks: int, master: tuple[str, int]
) -> list[str]:
    """torchrun's own arguments for one node (the program follows them)."""
    if nodes == 1:
        return [python, *TORCHRUN, "--standalone", f"--nproc-per-node={ranks}"]
    return [
        python,
        *TORCHRUN,
        f"--nnodes={nodes}",
        f"--node-rank={node_rank}",
        f"--nproc-per-node={ranks}",
        f"--master-addr={master[0]}",
        f"--master-port={master[1]}",
    ]


def wait_for(python: str, master: tuple[str, int], timeout_s: float, host: str) -> list[str]:
    """The prefix that makes a trainer node wait for the rendezvous before torchrun starts."""
    return [
        python,
        "-m",
        "grpo_stream.launch.rendezvous",
        f"--address={master[0]}:{master[1]}",
        f"--host-name={host}",
        f"--timeout={timeout_s:g}",
        "--",
    ]


def trainer_node_argv(
    cfg: RunConfig, placement: Placement, index: int, master: tuple[str, int], program: list[str]
) -> list[str]:
    """The command of trainer node `index`: `program` (python and its arguments) alone, or
    under torchrun, behind the rendezvous wait on nodes after the first."""
    python, args = program[0], program[1:]
    nodes, slot = len(placement.trainer), placement.trainer[index]
    if nodes == 1 and slot.ranks == 1:
        return program
    argv = torchrun_argv(python, nodes, index, slot.ranks, master) + args
    if index == 0:
        return argv
    return wait_for(python, master, cfg.trainer.rendezvous_timeout_s, slot.host) + argv


def _hosts(cluster: ClusterFile | None) -> dict[str, ClusterHost]:
    if cluster is None:
        return {"local": ClusterHost(name="local")}
    return {h.name: h for h in cluster.hosts}


def _via(
    cfg: RunConfig, hosts: dict[str, ClusterHost], name: str, spec: ServiceSpec
) -> ServiceSpec:
    """`spec` through host `name`'s launcher, its files shipped to RUN_DIR on that host."""
    if name == "local":
        return spec
    serves = cfg.weights.relay or cfg.hub.payloads == "direct"
    return place(hosts[name], spec, Path(cfg.run.run_dir), serves)


def placed_services(
    cfg: RunConfig,
    placement: Placement,
    hub: str,
    resume: bool,
    cluster: ClusterFile | None = None,
) -> list[tuple[ServiceSpec, Slot | None]]:
    """Trainer nodes, generators, scorers and (with eval.every) the evaluator, each with its
    device environment, through its host's launcher, beside the slot it holds (None: a
    scorer or evaluator without one); instances numbered in host order."""
    hosts = _hosts(cluster)
    keys = security_args(cfg)
    n = cfg.run.restarts
    master = (hosts[placement.trainer[0].host].address, cfg.trainer.rendezvous_port)
    program = service_argv("trainer", "trainer-0", hub, keys + (["--resume"] if resume else []))
    out: list[tuple[ServiceSpec, Slot | None]] = []
    for i, slot in enumerate(placement.trainer):
        python = hosts[slot.host].python or sys.executable
        argv = trainer_node_argv(cfg, placement, i, master, [python, *program[1:]])
        name = "trainer-0" if i == 0 else f"trainer-0-n{i}"
        spec = ServiceSpec(name, "trainer", argv, env=placement.env(slot), restarts_left=n)
        out.append((_via(cfg, hosts, slot.host, spec), slot))
    for i, slot in enumerate(placement.generators):
        name = f"generator-{i}"
        argv = service_argv("generator", name, hub, keys)
        spec = ServiceSpec(name, "generator", argv, env=placement.env(slot), restarts_left=n)
        out.append((_via(cfg, hosts, slot.host, spec), slot))
    number = 0
    for host in hosts.values():
        count = cfg.scorer.count if cluster is None else host.count("scorer")
        for _ in range(0 if generator_rewards(cfg.env) else count):
            name = f"scorer-{number}"
            argv = service_argv("scorer", name, hub, keys)
            held = placement.scorers[number] if number < len(placement.scorers) else None
            spec = ServiceSpec(name, "scorer", argv, env=placement.env(held), restarts_left=n)
            out.append((_via(cfg, hosts, host.name, spec), held))
            number += 1
    first = next(iter(hosts.values())).name
    if cfg.eval.every > 0:  # evaluation during training: one evaluator, on the first host
        argv = service_argv("evaluator", "evaluator-0", hub, keys)
        env = placement.env(placement.evaluator)
        spec = ServiceSpec("evaluator-0", "evaluator", argv, env=env, restarts_left=n)
        out.append((_via(cfg, hosts, first, spec), placement.evaluator))
    for i in range(teacher_count(cfg)):  # distillation: on their GPUs' host, else the first
        held = placement.teachers[i] if i < len(placement.teachers) else None
        argv = service_argv("teacher", f"teacher-{i}", hub, keys)
        spec = ServiceSpec(
            f"teacher-{i}", "teacher", argv, env=placement.env(held), restarts_left=n
        )
        out.append((_via(cfg, hosts, held.host if held else first, spec), held))
    on_this_machine = [
        (s, slot.ranks if slot and s.service == "trainer" else 1)
        for s, slot in out
        if s.host == "local" or hosts[s.host].launcher in SAME_MACHINE
    ]
    if cfg.run.torch_threads == "auto":
        shares = run_shares(Path(cfg.run.run_dir), cfg.generator.count)
        size_specs(cfg.run.torch_threads, on_this_machine, shares=shares)
    size_scorers(cfg.scorer.workers, cfg.run.torch_threads, on_this_machine)
    return out


def placed_specs(
    cfg: RunConfig,
    placement: Placement,
    hub: str,
    resume: bool,
    cluster: ClusterFile | None = None,
) -> list[ServiceSpec]:
    """The specs of `placed_services`."""
    return [spec for spec, _ in placed_services(cfg, placement, hub, resume, cluster)]


def hub_placer(
    cfg: RunConfig, placement: Placement, cluster: ClusterFile | None
) -> Callable[[ServiceSpec], ServiceSpec]:
    """The hub holds no GPU: its spec gets the device environment of a service without one."""
    hosts = _hosts(cluster)
    name = "local" if cluster is None else cluster.host_of("hub").name

    def placer(spec: ServiceSpec) -> ServiceSpec:
        spec.env = {**spec.env, **placement.env(None)}
        return _via(cfg, hosts, name, spec)

    return placer


def device_env(env: dict[str, str]) -> str:
    """Device variables as the dry run prints them (`-` when none are set)."""
    keys = ("CUDA_VISIBLE_DEVICES", *DEVICE_ORDER)
    shown = [f"{k}={env[k]}" for k in keys if k in env]
    return " ".join(shown) if shown else "-"


def dry_run_lines(
    placement: Placement, services: list[tuple[ServiceSpec, Slot | None]]
) -> list[str]:
    """One block per service: instance, host, device ids, device environment, command line;
    then the idle devices with their reasons."""
    lines = [f"placement: {placement.mode}"]
    for spec, slot in services:
        ids = ",".join(slot.device_ids) if slot and slot.device_ids else "-"
        ranks = f"  ranks={slot.ranks}" if spec.service == "trainer" and slot else ""
        lines.append(f"{spec.instance}  host={spec.host}  devices={ids}{ranks}")
        lines.append(f"  env: {device_env(placement.env(slot))}")
        lines.append(f"  cmd: {shlex.join([*spec.prefix, *spec.argv])}")
    for device_id, why in placement.idle:
        lines.append(f"idle {device_id}: {why}")
    return lines


def cluster_overrides(cluster: ClusterFile, placement: Placement) -> list[str]:
    """The cluster's binds with rank 0 on the placement's first trainer host, and
    trainer.ranks as the placement counts them (the cluster wins over the config)."""
    ranks = sum(slot.ranks for slot in placement.trainer)
    host = placement.trainer[0].host
    return [*config_overrides(cluster, trainer_host=host), f"trainer.ranks={ranks}"]


def dry_run(
    cfg: RunConfig,
    placement: Placement,
    hub_spec: ServiceSpec,
    resume: bool,
    cluster: ClusterFile | None,
) -> list[str]:
    """What `up --dry-run` prints: the hub, then every service `up` would start."""
    hub = cfg.hub.public_address or cfg.hub.bind
    if hub.endswith(":0"):
        hub = hub[:-1] + "PORT"  # the port the hub picks when it starts
    services = [(hub_spec, None), *placed_services(cfg, placement, hub, resume, cluster)]
    return dry_run_lines(placement, services)


def hub_spec(cfg: RunConfig, placement: Placement, cluster: ClusterFile | None) -> ServiceSpec:
    """The hub of a fresh run, placed (what `plan` prints first)."""
    spec = hub_service(cfg, Path(cfg.run.run_dir) / "config.toml", False)
    return hub_placer(cfg, placement, cluster)(spec)
