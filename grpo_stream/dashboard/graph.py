"""The service graph the page draws: one node per service instance (the hub among them), with
its state, device, weights version, credits and throughput, and the hub's queues.

Live, the nodes come from the hub's Status (display fields, read as such: a field a peer did
not report shows empty); an instance the hub stops listing is shown `lost` until it returns.
Once the run is over, they come from the services' logs (`rundir.LoggedService`), `stopped`.

Throughput per node: a generator's own tokens/s (its heartbeat); a scorer's groups scored per
second and the hub's groups trained per second, both as the change between two polls; the
trainer's steps per second over its last `RATE_STEPS` metrics rows.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from grpo_stream.dashboard.rundir import LoggedService
from grpo_stream.session.status import HubStatus

HUB_INSTANCE = "grouper-0"
RATE_STEPS = 10
"""Metrics rows the trainer's steps/s is measured over."""
QUEUE_KEYS = ("in_progress", "buffer", "to_score", "retry", "trained", "dispatched")
"""Hub counters shown as the pipeline's queues and totals."""


@dataclass
class Node:
    """One service instance on the graph."""

    instance: str
    service: str  # grouper, trainer, generator, scorer, evaluator
    state: str  # running, lost, stopped
    host: str = ""
    device: str = ""
    devices: str = ""
    version: int | None = None
    credits: int | None = None
    throughput: float | None = None
    unit: str = ""
    joined: int | None = None


class Rates:
    """Per-second change of counters between two polls."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}

    def rate(self, key: str, value: float, now: float) -> float | None:
        last = self._last.get(key)
        self._last[key] = (now, value)
        if last is None or now <= last[0] or value < last[1]:
            return None  # first sight, or a restarted counter
        return (value - last[1]) / (now - last[0])


class GraphBuilder:
    """Builds the graph of each poll; remembers instances to show the lost ones."""

    def __init__(self) -> None:
        self.rates = Rates()
        self._seen: dict[str, Node] = {}

    def live(self, status: HubStatus, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        """The graph from the hub's answer (and the trainer's recent metrics rows)."""
        now = time.monotonic()
        counters = status.counters
        hub = Node(HUB_INSTANCE, "grouper", "running", host=_host(status.hub))
        hub.version = status.policy_version
        hub.throughput = self.rates.rate("hub.trained", _num(counters.get("trained")), now)
        hub.unit = "groups/s"
        nodes = [hub] + [self._peer(svc, metrics, now) for svc in status.services]
        listed = {n.instance for n in nodes}
        for instance, node in self._seen.items():
            if instance not in listed:
                node.state, node.throughput = "lost", None
                nodes.append(node)
        self._seen = {n.instance: n for n in nodes}
        queues = {k: counters[k] for k in QUEUE_KEYS if k in counters}
        return {"nodes": [asdict(n) for n in _ordered(nodes)], "queues": queues}

    def _peer(self, svc: dict[str, Any], metrics: list[dict[str, Any]], now: float) -> Node:
        node = Node(
            instance=str(svc.get("instance", "?")),
            service=str(svc.get("service", "?")),
            state="running",
            host=str(svc.get("host", "")),
            device=str(svc.get("device", "")),
            devices=str(svc.get("devices", "")),
            credits=_opt_int(svc.get("credits")),
            joined=_opt_int(svc.get("joined")),
            version=_opt_int(svc.get("version")),
        )
        if node.service == "generator":
            node.throughput, node.unit = _opt_float(svc.get("tokens_per_s")), "tok/s"
        elif node.service == "scorer":
            scored = _num(svc.get("groups_scored"))
            node.throughput = self.rates.rate(f"{node.instance}.scored", scored, now)
            node.unit = "groups/s"
        elif node.service == "trainer":
            node.throughput, node.unit = steps_per_s(metrics), "steps/s"
            if metrics and isinstance(metrics[-1].get("policy_version"), int):
                node.version = int(metrics[-1]["policy_version"])
        return node


def finished(
    logged: dict[str, LoggedService], metrics: list[dict[str, Any]], counters: dict[str, int]
) -> dict[str, Any]:
    """The graph of a run that is over, from its logs: every instance that logged, stopped;
    the queues as the hub's last checkpoint counted them."""
    nodes = [
        Node(s.instance, s.service, "stopped", device=s.device, version=s.version)
        for s in logged.values()
    ]
    if not any(n.service == "grouper" for n in nodes):
        nodes.append(Node(HUB_INSTANCE, "grouper", "stopped"))
    for node in nodes:
        if node.service == "trainer":
            node.throughput, node.unit = steps_per_s(metrics), "steps/s"
    queues = {k: counters[k] for k in QUEUE_KEYS if k in counters}
    return {"nodes": [asdict(n) for n in _ordered(nodes)], "queues": queues}


def steps_per_s(metrics: list[dict[str, Any]]) -> float | None:
    """Trainer steps per second over the last RATE_STEPS rows (their wall_time)."""
    rows = [r for r in metrics[-RATE_STEPS - 1 :] if isinstance(r.get("wall_time"), (int, float))]
    if len(rows) < 2:
        return None
    steps = float(rows[-1]["step"]) - float(rows[0]["step"])
    seconds = float(rows[-1]["wall_time"]) - float(rows[0]["wall_time"])
    return steps / seconds if seconds > 0 and steps > 0 else None


ORDER = {"grouper": 0, "trainer": 1, "generator": 2, "scorer": 3, "evaluator": 4}


def _ordered(nodes: list[Node]) -> list[Node]:
    return sorted(nodes, key=lambda n: (ORDER.get(n.service, 9), n.instance))


def _host(address: str) -> str:
    """The host part of tcp://HOST:PORT."""
    return address.removeprefix("tcp://").rsplit(":", 1)[0]


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None
