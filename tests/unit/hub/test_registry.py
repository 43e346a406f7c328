"""The hub's registry: what `status` shows of each peer, what heartbeats bring."""

from __future__ import annotations

from grpo_stream.hardware.fingerprint import fingerprint_host
from grpo_stream.hardware.recorded import RecordedNvml, load_record
from grpo_stream.hub.registry import Peer, Registry
from grpo_stream.launch.devices import assigned
from grpo_stream.protocols.messages import GeneratorStats, Heartbeat, ScorerStats


def _host(*names: str):
    return fingerprint_host(benchmark=False, nvml=RecordedNvml([load_record(n) for n in names]))


def test_the_hub_shows_the_gpus_a_peer_holds() -> None:
    host = assigned(_host("h100-sxm", "h100-sxm"), {"CUDA_VISIBLE_DEVICES": "1"})
    peer = Peer("generator", "generator-0", b"id", "h", 1, 0, host.to_dict())
    assert peer.describe()["devices"] == f"{host.hostname}:1"


def test_a_peer_without_nvml_shows_cpu() -> None:
    peer = Peer("scorer", "scorer-0", b"id", "h", 1, 0, {"source": "cpu", "devices": []})
    assert peer.describe()["devices"] == "cpu"


def _registered() -> Registry:
    registry = Registry(heartbeat_timeout_s=10.0)
    registry.register(Peer("generator", "generator-0", b"id", "h", 1, 0, {}), now=0.0)
    return registry


def test_a_heartbeat_brings_a_generators_typed_stats_into_status() -> None:
    registry = _registered()
    stats = GeneratorStats(
        tokens_per_s=12.5, wait_s=1.0, version=3, batches=2, prompts_total=8, busy_s=0.5
    )
    beat = Heartbeat(instance="generator-0", stats={"note": "x"}, hub_rtt_s=0.002, generator=stats)
    assert registry.beat("generator-0", 1.0, beat)
    peer = registry.peers["generator-0"]
    assert peer.generator == stats
    shown = peer.describe()
    assert (shown["tokens_per_s"], shown["version"], shown["hub_rtt_s"]) == (12.5, 3, 0.002)
    assert shown["note"] == "x"


def test_a_heartbeat_without_stats_keeps_the_last_reported_ones() -> None:
    registry = _registered()
    stats = GeneratorStats(
        tokens_per_s=12.5, wait_s=1.0, version=3, batches=2, prompts_total=8, busy_s=0.5
    )
    registry.beat("generator-0", 1.0, Heartbeat(instance="generator-0", generator=stats))
    registry.beat("generator-0", 2.0, Heartbeat(instance="generator-0"))
    assert registry.peers["generator-0"].generator == stats


def test_a_heartbeat_from_an_unknown_instance_is_not_taken() -> None:
    assert not _registered().beat("ghost", 1.0, Heartbeat(instance="ghost"))


def test_a_peer_is_found_by_its_identity_until_it_is_removed_or_lost() -> None:
    registry = _registered()
    registry.register(Peer("scorer", "scorer-0", b"sid", "h", 1, 0, {}), now=5.0)
    assert registry.by_identity(b"id") is registry.peers["generator-0"]
    registry.remove("scorer-0")
    assert registry.by_identity(b"sid") is None
    assert [p.instance for p in registry.expire(now=11.0)] == ["generator-0"]
    assert registry.by_identity(b"id") is None


def test_a_restarted_instance_is_found_by_its_new_identity_only() -> None:
    registry = _registered()
    registry.register(Peer("generator", "generator-0", b"new", "h", 2, 0, {}), now=1.0)
    assert registry.by_identity(b"new") is registry.peers["generator-0"]
    assert registry.by_identity(b"id") is None


def test_an_identity_taken_over_by_another_instance_stays_with_it() -> None:
    registry = _registered()  # generator-0 on b"id"
    registry.register(Peer("generator", "generator-1", b"id", "h", 2, 0, {}), now=1.0)
    registry.remove("generator-0")  # the older peer leaving does not forget the newer one
    assert registry.by_identity(b"id") is registry.peers["generator-1"]


def test_a_heartbeat_brings_a_scorers_typed_stats_into_status() -> None:
    registry = Registry(heartbeat_timeout_s=5.0)
    registry.register(Peer("scorer", "scorer-0", b"s0", "h", 1, 0, {}), now=0.0)
    stats = ScorerStats(cpu_s=0.25, completions=80, groups=10, calls=30, workers=2)
    assert registry.beat("scorer-0", 1.0, Heartbeat(instance="scorer-0", scorer=stats))
    registry.beat("scorer-0", 2.0, Heartbeat(instance="scorer-0"))
    assert registry.peers["scorer-0"].scorer == stats
    assert registry.peers["scorer-0"].describe()["completions"] == 80
