"""Relay fan-out over real sockets: fetchers beyond `weights.fanout` are redirected to a
generator that relays its stream, and a relay killed mid-stream leaves no one behind."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from structlog.testing import capture_logs

from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.transport.fetch import Replica
from grpo_stream.transport.relay import Relay
from grpo_stream.transport.sockets import Context
from grpo_stream.transport.weights import WeightServer

LOCAL = "tcp://127.0.0.1:0"
SETTINGS = TransportSettings(io_timeout_ms=2000, weights_chunk_bytes=64 * 1024)
PEER = Path(__file__).with_name("_relay_peer.py")


def _set(version: int, n: int = 8, numel: int = 64 * 1024) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(version)
    return [(f"t{i}", torch.randn(numel, generator=gen)) for i in range(n)]


def _holds(replica: Replica, named: list[tuple[str, torch.Tensor]]) -> bool:
    return [n for n, _ in replica.named()] == [n for n, _ in named] and all(
        a.tobytes() == t.numpy().tobytes()
        for (_, a), (_, t) in zip(replica.named(), named, strict=True)
    )


def _server(ctx: Context, fanout: int) -> WeightServer:
    weights = WeightsSettings(relay=True, fanout=fanout, relay_stall_s=1.0)
    return WeightServer(ctx, LOCAL, LOCAL, SETTINGS, SecuritySettings(), weights)


def _fetch(
    ctx: Context, address: str, relay: Any, replica: Replica, secret: bytes | None = None
) -> int:
    """Fetch the newest version into `replica` (as a relay's owner when `relay`), each
    request signed with `secret` (the run's) when given."""
    weights = WeightsSettings(relay=True, relay_stall_s=1.0)
    plain = SecuritySettings()
    return replica.fetch(
        ctx, address, SETTINGS, plain, timeout_s=30, weights=weights, relay=relay, secret=secret
    )


def test_fetchers_beyond_the_fanout_are_served_by_a_relay(ctx: Context) -> None:
    server = _server(ctx, fanout=1)
    relays = [Relay(ctx, LOCAL, SETTINGS, SecuritySettings()) for _ in range(3)]
    try:
        named = _set(1)
        server.publish(1, named)
        replicas = [Replica() for _ in relays]
        for relay, replica in zip(relays, replicas, strict=True):
            assert _fetch(ctx, server.addresses["weights"], relay, replica) == 1
        assert all(_holds(r, named) for r in replicas)
        assert server.redirects == 2  # only the first came from the trainer
        assert server.served == 1
        assert relays[0].served == 1 and relays[1].served == 1  # a chain: fanout 1
    finally:
        for relay in relays:
            relay.close()
        server.close()


@pytest.mark.slow
def test_a_fetcher_sent_to_a_relay_is_logged(ctx: Context) -> None:
    server = _server(ctx, fanout=1)
    relays = [Relay(ctx, LOCAL, SETTINGS, SecuritySettings()) for _ in range(2)]
    try:
        server.publish(1, _set(1))
        with capture_logs() as logs:
            for relay in relays:
                assert _fetch(ctx, server.addresses["weights"], relay, Replica()) == 1
        said = [e for e in logs if e["event"] == "weights.sent_to_relay"]
        assert [(e["version"], e["relay"]) for e in said] == [(1, relays[0].address)]
    finally:
        for relay in relays:
            relay.close()
        server.close()


def test_killed_relay_mid_stream_every_fetcher_ends_on_the_right_version(ctx: Context) -> None:
    server = _server(ctx, fanout=1)
    named = _set(3, n=32)  # 32 chunks, each handed on 0.1 s late by the relay
    server.publish(3, named)
    relay = subprocess.Popen(
        [sys.executable, str(PEER), server.addresses["weights"], "0.1"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    results: list[int] = []
    replicas = [Replica(), Replica()]
    try:
        assert relay.stdout is not None
        json.loads(relay.stdout.readline())  # bound
        deadline = time.monotonic() + 30
        while server.served == 0 and server.sent_bytes == 0 and time.monotonic() < deadline:
            time.sleep(0.02)  # until the relay is the trainer's direct child
        own = [Relay(ctx, LOCAL, SETTINGS, SecuritySettings()) for _ in replicas]

        def child(i: int) -> None:
            results.append(_fetch(ctx, server.addresses["weights"], own[i], replicas[i]))

        with capture_logs() as logs:
            threads = [threading.Thread(target=child, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            time.sleep(1.0)  # children are mid-stream: about 10 of 32 chunks relayed
            relay.kill()
            for t in threads:
                t.join(timeout=60)
        for r in own:
            r.close()
    finally:
        relay.kill()
        relay.wait()
        server.close()
    assert results == [3, 3]
    assert all(_holds(r, named) for r in replicas)
    assert any(e["event"] == "weights.relay_failed" for e in logs)
