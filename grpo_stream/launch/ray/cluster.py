"""The Ray cluster as `up --launcher ray` sees it: its live nodes as the hosts of a cluster,
which service runs on which node, and the devices placement gives each.

- The hub runs on the node of the driver (`up`), or on the first node when the driver is
  not on one. Without GPUs anywhere the trainer runs there too (all `trainer.ranks` under
  torchrun), generators are spread over the other nodes (all on the hub's node when it is
  the only one), then scorers, last node first.
- With GPUs, each node's GPUs are read through NVML on that node (a Ray task pinned to it)
  and the fingerprint plan places the trainer's ranks and the generators
  (grpo_stream.launch.placement): Ray reserves the GPUs (num_gpus; one placement group for
  every trainer node) and the service gets the plan's own GPU indices.
- Every node is a ClusterHost with launcher "ray", so the command lines are the ones
  `up --cluster` builds (grpo_stream.launch.placed); the hub binds a port found free on its
  node before it starts (a restarted hub comes back at the same address).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from grpo_stream.config import RunConfig
from grpo_stream.config.cluster import ClusterFile, ClusterHost
from grpo_stream.hardware.device import HostFingerprint
from grpo_stream.launch.devices import local_fingerprint, model_params
from grpo_stream.launch.placement import HostDevices, Placement, place
from grpo_stream.launch.ray.actor import free_port


class RayClusterError(RuntimeError):
    """The Ray cluster cannot run this run; the message is one line."""


@dataclass(frozen=True)
class RayNode:
    """One live node of the Ray cluster."""

    name: str
    """Its host name (its address where host names repeat)."""
    node_id: str
    address: str


def connect(address: str | None) -> None:
    """Join the Ray cluster at `address` (host:port of its head), or start a local one."""
    try:
        ray.init(
            address=address,
            log_to_driver=False,
            logging_level=logging.ERROR,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = address or "a local cluster"
        raise RayClusterError(f"cannot join Ray at {where} (--address): {exc}") from None


def live_nodes() -> list[RayNode]:
    """The cluster's live nodes, in the order Ray lists them."""
    listed: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    rows = [n for n in listed if n.get("Alive")]
    names = Counter(str(n["NodeManagerHostname"]) for n in rows)
    return [
        RayNode(
            name=str(n["NodeManagerHostname"])
            if names[n["NodeManagerHostname"]] == 1
            else str(n["NodeManagerAddress"]),
            node_id=str(n["NodeID"]),
            address=str(n["NodeManagerAddress"]),
        )
        for n in rows
    ]


def on_node(node: RayNode) -> NodeAffinitySchedulingStrategy:
    """Scheduling that keeps a task or actor on `node` (and fails when it is gone)."""
    return NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False)


def hub_node(nodes: list[RayNode]) -> RayNode:
    driver = ray.get_runtime_context().get_node_id()
    return next((n for n in nodes if n.node_id == driver), nodes[0])


def _spread(count: int, over: list[RayNode]) -> Counter[str]:
    return Counter(over[i % len(over)].name for i in range(count))


def cluster_file(cfg: RunConfig, nodes: list[RayNode], hub: RayNode, port: int) -> ClusterFile:
    """Every node as a host with launcher "ray" and the services the CPU layout gives it
    (placement moves the trainer and generators where GPUs are)."""
    others = [n for n in nodes if n is not hub]
    generators = _spread(cfg.generator.count, others or [hub])
    scorers = _spread(cfg.scorer.count, list(reversed(others)) or [hub])
    hosts = []
    for node in nodes:
        services = {"generator": generators[node.name], "scorer": scorers[node.name]}
        if node is hub:
            services |= {"hub": 1, "trainer": cfg.trainer.ranks}
        hosts.append(
            ClusterHost(
                name=node.name,
                address=node.address,
                bind=node.address,
                launcher="ray",
                services=services,
            )
        )
    return ClusterFile(hub_port=port, hosts=hosts)


def _fingerprint() -> HostFingerprint:
    return local_fingerprint()


def node_devices(nodes: list[RayNode]) -> dict[str, HostFingerprint]:
    """Each node's GPUs, read through NVML on that node."""
    task: Any = ray.remote(num_cpus=0)(_fingerprint)
    refs = {n.name: task.options(scheduling_strategy=on_node(n)).remote() for n in nodes}
    return {name: ray.get(ref, timeout=120) for name, ref in refs.items()}


def hub_port(hub: RayNode) -> int:
    task: Any = ray.remote(num_cpus=0)(free_port)
    port: int = ray.get(
        task.options(scheduling_strategy=on_node(hub)).remote(hub.address), timeout=60
    )
    return port


def placement_of(
    cfg: RunConfig, cluster: ClusterFile, devices: dict[str, HostFingerprint]
) -> Placement:
    """Placement over the nodes (grpo_stream.launch.placement), each with its own GPUs."""
    hosts = [
        HostDevices(
            name=h.name,
            gpus=[d for d in devices[h.name].devices if d.kind == "gpu"],
            trainer_ranks=h.count("trainer"),
            generators=h.count("generator"),
            where=h.name,
        )
        for h in cluster.hosts
    ]
    params = model_params(cfg) if any(h.gpus for h in hosts) else None
    return place(cfg, hosts, params)


def discover(cfg: RunConfig) -> tuple[list[RayNode], ClusterFile, Placement]:
    """The connected cluster's nodes, the cluster file `up` runs it as, and the placement."""
    nodes = live_nodes()
    if not nodes:
        raise RayClusterError("the Ray cluster has no live node")
    hub = hub_node(nodes)
    cluster = cluster_file(cfg, nodes, hub, hub_port(hub))
    return nodes, cluster, placement_of(cfg, cluster, node_devices(nodes))
