"""Weights under the run's secret, over real sockets: a fetcher without the secret gets no
byte of the weights, from the trainer's server or from a relay, and becomes no relay; a relay
serving anything but the version the trainer published is refused: the fetcher gets that
version from the trainer's server instead."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
import torch
from structlog.testing import capture_logs

from grpo_stream.config.transport import SecuritySettings, WeightsSettings
from grpo_stream.protocols.messages import WeightsChunk, WeightsRequest
from grpo_stream.transport.errors import WeightsError
from grpo_stream.transport.fetch import Replica
from grpo_stream.transport.relay import Relay
from grpo_stream.transport.sockets import Context, Server
from grpo_stream.transport.weights import WeightServer, build_snapshot

from .test_relay import LOCAL, SETTINGS, _fetch, _holds, _set

SECRET = b"r" * 64


def _server(ctx: Context) -> WeightServer:
    weights = WeightsSettings(relay=True, fanout=1, relay_stall_s=1.0)
    return WeightServer(ctx, LOCAL, LOCAL, SETTINGS, SecuritySettings(), weights, secret=SECRET)


def test_a_fetcher_without_the_secret_gets_nothing_and_relays_nothing(ctx: Context) -> None:
    server = _server(ctx)
    stranger, honest = Relay(ctx, LOCAL, SETTINGS, SecuritySettings()), None
    try:
        server.publish(1, _set(1))
        replica = Replica()
        with capture_logs() as logs, pytest.raises(WeightsError, match="unauthorized"):
            _fetch(ctx, server.addresses["weights"], stranger, replica)
        assert replica.version == -1 and server.sent_bytes == 0  # not one byte
        refused = [e for e in logs if e["event"] == "weights.refused_fetch"]
        assert refused and refused[0]["log_level"] == "error"
        honest = Relay(ctx, LOCAL, SETTINGS, SecuritySettings(), secret=SECRET)
        assert _fetch(ctx, server.addresses["weights"], honest, Replica(), SECRET) == 1
        assert _fetch(ctx, server.addresses["weights"], None, Replica(), SECRET) == 1
        assert server.redirects == 1 and honest.served == 1  # a member's relay
        assert stranger.served == 0
    finally:
        stranger.close()
        if honest is not None:
            honest.close()
        server.close()


def test_a_relay_serves_no_stranger(ctx: Context) -> None:
    server = _server(ctx)
    relay = Relay(ctx, LOCAL, SETTINGS, SecuritySettings(), secret=SECRET)
    try:
        server.publish(1, _set(1))
        assert _fetch(ctx, server.addresses["weights"], relay, Replica(), SECRET) == 1
        replica = Replica()
        with pytest.raises(WeightsError, match="unauthorized"):
            _fetch(ctx, relay.address, None, replica)  # straight to the relay, unsigned
        assert replica.version == -1 and relay.served == 0
    finally:
        relay.close()
        server.close()


@dataclass
class Forger:
    """A relay holding the secret that serves, for version 1, another weight set with its own
    consistent checksums (a compromised generator)."""

    ctx: Context
    chunks: tuple[WeightsChunk, ...]
    address: str = ""
    served: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        server = Server(self.ctx, LOCAL, SETTINGS, SecuritySettings(), "forger")
        self.address = server.address
        threading.Thread(target=self._serve, args=(server,), daemon=True).start()

    def _serve(self, server: Server) -> None:
        while not self._stop.is_set():
            got = server.recv(20)
            if got is not None and isinstance(got[1], WeightsRequest):
                self.served += 1
                for chunk in self.chunks:
                    server.send(got[0], chunk)
        server.close()

    def expect(self, version: int, base: int) -> None: ...
    def offer(self, chunk: WeightsChunk) -> None: ...
    def abort(self) -> None: ...

    def close(self) -> None:
        self._stop.set()


def test_a_relay_serving_other_weights_is_refused_and_the_trainers_fetched(ctx: Context) -> None:
    server = _server(ctx)
    named = _set(1)
    other = [(n, t + 1.0) for n, t in named]
    forger = Forger(ctx, build_snapshot(1, other, SETTINGS).chunks)
    forger.start()
    try:
        server.publish(1, named)
        assert _fetch(ctx, server.addresses["weights"], forger, Replica(), SECRET) == 1  # a member
        replica = Replica()
        with capture_logs() as logs:
            assert _fetch(ctx, server.addresses["weights"], None, replica, SECRET) == 1
        assert server.redirects == 1 and forger.served == 1  # sent to the forger, which served
        refused = [e for e in logs if e["event"] == "weights.refused"]
        assert refused and "the trainer announced" in refused[0]["reason"]
        assert _holds(replica, named)  # the published weights, not the forger's
        assert not torch.equal(other[0][1], named[0][1])
    finally:
        forger.close()
        server.close()
