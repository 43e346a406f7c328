"""Relays under the run's secret, over real sockets: only a fetcher that signs its relay claim
becomes a relay, and a relay serving anything but the version the trainer published is
refused: the fetcher gets that version from the trainer's server instead."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
from structlog.testing import capture_logs

from grpo_stream.config.transport import SecuritySettings, WeightsSettings
from grpo_stream.protocols.messages import WeightsChunk, WeightsRequest
from grpo_stream.transport.fetch import Replica
from grpo_stream.transport.relay import Relay
from grpo_stream.transport.runsecret import relay_claim
from grpo_stream.transport.sockets import Context, Server
from grpo_stream.transport.weights import WeightServer, build_snapshot

from .test_relay import LOCAL, SETTINGS, _fetch, _holds, _set

SECRET = b"r" * 64


def _server(ctx: Context) -> WeightServer:
    weights = WeightsSettings(relay=True, fanout=1, relay_stall_s=1.0)
    return WeightServer(ctx, LOCAL, LOCAL, SETTINGS, SecuritySettings(), weights, secret=SECRET)


def test_a_relay_without_the_secrets_claim_is_never_made_one(ctx: Context) -> None:
    server = _server(ctx)
    stranger, honest = Relay(ctx, LOCAL, SETTINGS, SecuritySettings()), None
    try:
        server.publish(1, _set(1))
        with capture_logs() as logs:
            assert _fetch(ctx, server.addresses["weights"], stranger, Replica()) == 1
        assert any(e["event"] == "weights.relay_refused" for e in logs)
        honest = Relay(ctx, LOCAL, SETTINGS, SecuritySettings(), secret=SECRET)
        assert _fetch(ctx, server.addresses["weights"], honest, Replica()) == 1
        assert server.redirects == 0 and stranger.served == 0  # the stranger relays nothing
        assert _fetch(ctx, server.addresses["weights"], None, Replica()) == 1
        assert server.redirects == 1 and honest.served == 1  # a signed claim: a relay
    finally:
        stranger.close()
        if honest is not None:
            honest.close()
        server.close()


@dataclass
class Forger:
    """A relay holding the secret that serves, for version 1, another weight set with its own
    consistent checksums (a compromised generator)."""

    ctx: Context
    chunks: tuple[WeightsChunk, ...]
    address: str = ""
    claim: str = ""
    served: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        server = Server(self.ctx, LOCAL, SETTINGS, SecuritySettings(), "forger")
        self.address = server.address
        self.claim = relay_claim(SECRET, self.address)
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
        assert _fetch(ctx, server.addresses["weights"], forger, Replica()) == 1  # joins the tree
        replica = Replica()
        with capture_logs() as logs:
            assert _fetch(ctx, server.addresses["weights"], None, replica) == 1
        assert server.redirects == 1 and forger.served == 1  # sent to the forger, which served
        refused = [e for e in logs if e["event"] == "weights.refused"]
        assert refused and "the trainer announced" in refused[0]["reason"]
        assert _holds(replica, named)  # the published weights, not the forger's
        assert not torch.equal(other[0][1], named[0][1])
    finally:
        forger.close()
        server.close()
