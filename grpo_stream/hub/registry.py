"""Who is connected to the hub: services, their credits, heartbeats and reported stats."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from grpo_stream.protocols.messages import GeneratorStats, Heartbeat, ScorerStats
from grpo_stream.transport.heartbeat import Heartbeats
from grpo_stream.transport.seal import Opener


@dataclass
class Peer:
    """One registered service instance."""

    service: str
    instance: str
    identity: bytes
    host: str
    pid: int
    rank: int
    fingerprint: dict[str, Any]
    credits: int = 0
    stats: dict[str, Any] = field(default_factory=dict)  # display only (Heartbeat.stats)
    generator: GeneratorStats | None = None  # a generator's last reported counters
    scorer: ScorerStats | None = None  # a scorer's last reported counters
    hub_rtt_s: float | None = None
    joined: int = 1  # times this instance registered (restarts)
    opener: Opener | None = field(default=None, repr=False)
    """With the run's secret: checks the seal of every message of this peer's session."""
    user_id: str | None = None
    """Under CURVE: the client key its Hello came with; every message must come with it."""

    def describe(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "instance": self.instance,
            "host": self.host,
            "pid": self.pid,
            "rank": self.rank,
            "credits": self.credits,
            "joined": self.joined,
            "device": _device_name(self.fingerprint),
            "devices": _device_ids(self.fingerprint),
            **{k: v for k, v in self.stats.items() if isinstance(v, (int, float, str, bool))},
            **({} if self.generator is None else asdict(self.generator)),
            **({} if self.scorer is None else asdict(self.scorer)),
            **({} if self.hub_rtt_s is None else {"hub_rtt_s": self.hub_rtt_s}),
        }


def _device_name(fingerprint: dict[str, Any]) -> str:
    devices = fingerprint.get("devices")
    if isinstance(devices, list) and devices and isinstance(devices[0], dict):
        return str(devices[0].get("name", ""))
    return ""


def _device_ids(fingerprint: dict[str, Any]) -> str:
    """The GPUs a peer holds, as fingerprint ids (host:index), or "cpu"."""
    devices = fingerprint.get("devices")
    if fingerprint.get("source") != "nvml" or not isinstance(devices, list):
        return "cpu"
    return ",".join(f"{d.get('host')}:{d.get('index')}" for d in devices if isinstance(d, dict))


class Registry:
    """Peers by instance name; lost peers are removed and counted."""

    def __init__(self, heartbeat_timeout_s: float) -> None:
        self.heartbeats: Heartbeats[str] = Heartbeats(heartbeat_timeout_s)
        self.peers: dict[str, Peer] = {}
        self._instance_of: dict[bytes, str] = {}  # main socket identity -> instance
        self._of: dict[str, dict[str, Peer]] = {}  # service -> its peers by instance
        self.lost_total = 0
        self._history: dict[str, int] = {}

    def register(self, peer: Peer, now: float) -> Peer:
        self.heartbeats.beat(peer.instance, now)
        peer.joined = self._history.get(peer.instance, 0) + 1
        self._history[peer.instance] = peer.joined
        old = self.peers.get(peer.instance)
        if old is not None:  # a restart keeps its place in `of` (dispatch breaks ties by it)
            self._forget_identity(old)
            if old.service != peer.service:
                self._of[old.service].pop(old.instance)
        self.peers[peer.instance] = peer
        self._instance_of[peer.identity] = peer.instance
        self._of.setdefault(peer.service, {})[peer.instance] = peer
        return peer

    def by_identity(self, identity: bytes) -> Peer | None:
        """The peer whose main socket has `identity` (every message asks: a dict, no scan)."""
        instance = self._instance_of.get(identity)
        return None if instance is None else self.peers.get(instance)

    def beat(self, instance: str, now: float, heartbeat: Heartbeat | None = None) -> bool:
        """A sign of life (any message); a Heartbeat also brings the peer's counters."""
        peer = self.peers.get(instance)
        if peer is None:
            return False
        self.heartbeats.beat(instance, now)
        if heartbeat is not None:
            peer.stats.update(heartbeat.stats)
            peer.generator = heartbeat.generator or peer.generator
            peer.scorer = heartbeat.scorer or peer.scorer
            peer.hub_rtt_s = (
                heartbeat.hub_rtt_s if heartbeat.hub_rtt_s is not None else peer.hub_rtt_s
            )
        return True

    def remove(self, instance: str) -> Peer | None:
        self.heartbeats.forget(instance)
        peer = self.peers.pop(instance, None)
        if peer is not None:
            self._forget_identity(peer)
            self._of[peer.service].pop(peer.instance)
        return peer

    def expire(self, now: float) -> list[Peer]:
        """Remove and return peers silent past the heartbeat deadline."""
        lost = [self.peers.pop(i) for i in self.heartbeats.lost(now) if i in self.peers]
        for peer in lost:
            self._forget_identity(peer)
            self._of[peer.service].pop(peer.instance)
        self.lost_total += len(lost)
        return lost

    def _forget_identity(self, peer: Peer) -> None:
        if self._instance_of.get(peer.identity) == peer.instance:  # not a newer peer's
            del self._instance_of[peer.identity]

    def of(self, service: str) -> list[Peer]:
        """The peers of one service, in the order they registered (no scan of the others)."""
        return list(self._of.get(service, {}).values())

    def describe(self) -> list[dict[str, Any]]:
        return [p.describe() for p in self.peers.values()]
