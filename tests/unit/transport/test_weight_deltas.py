"""Versions sent as deltas over real sockets: bit-exact after many versions, for fetchers
that skipped versions or joined late, and refusals of bad deltas (re-fetched in full)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from structlog.testing import capture_logs

from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.protocols.messages import WeightsChunk, WeightsRequest
from grpo_stream.transport.delta import XOR_ZSTD
from grpo_stream.transport.fetch import Replica
from grpo_stream.transport.sockets import Context, Server
from grpo_stream.transport.weights import WeightServer, build_snapshot

LOCAL = "tcp://127.0.0.1:0"
SETTINGS = TransportSettings(io_timeout_ms=2000, weights_chunk_bytes=16 * 1024)


class Trainer:
    """fp32 master weights trained by real AdamW steps on a real loss; publishes bf16."""

    def __init__(self, lr: float = 1e-3) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.params = [torch.nn.Parameter(torch.randn(64, 64) * 0.02) for _ in range(3)]
        self.opt = torch.optim.AdamW(self.params, lr=lr)
        self.x = torch.randn(32, 64)

    def step(self) -> None:
        h = self.x
        for p in self.params:
            h = torch.tanh(h @ p)
        loss = (h - 0.5).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def named(self) -> list[tuple[str, torch.Tensor]]:
        return [(f"w{i}", p.detach().to(torch.bfloat16)) for i, p in enumerate(self.params)]


def _same(replica: Replica, named: list[tuple[str, torch.Tensor]]) -> bool:
    held = replica.named()
    return [n for n, _ in held] == [n for n, _ in named] and all(
        a.tobytes() == t.view(torch.int16).numpy().tobytes()
        for (_, a), (_, t) in zip(held, named, strict=True)
    )


@pytest.fixture
def server(ctx: Context) -> Iterator[WeightServer]:
    # every delta is used however large (these AdamW steps at lr 1e-3 move most bf16 elements,
    # so a delta is over the default weights.delta_max_ratio): the mechanism is under test
    deltas = WeightsSettings(delta_max_ratio=1.0)
    weights = WeightServer(ctx, LOCAL, LOCAL, SETTINGS, SecuritySettings(), deltas)
    yield weights
    weights.close()


def _fetch(replica: Replica, ctx: Context, address: str) -> int:
    return replica.fetch(ctx, address, SETTINGS, SecuritySettings(), timeout_s=20)


def _version_zero_held(server: WeightServer, ctx: Context) -> tuple[Trainer, Replica, str]:
    """A trainer's version 0 published, and a replica that fetched it (in full)."""
    trainer, replica = Trainer(), Replica()
    address = server.addresses["weights"]
    server.publish(0, trainer.named())
    _fetch(replica, ctx, address)
    return trainer, replica, address


def _fetched_as_delta(
    replica: Replica, ctx: Context, address: str, version: int, full: int, trainer: Trainer
) -> None:
    """The replica fetches `version`, in fewer bytes than the `full` set (a delta), and then
    holds the trainer's weights bit for bit."""
    assert _fetch(replica, ctx, address) == version
    assert replica.last_wire_bytes < full
    assert _same(replica, trainer.named()), version


def test_fifty_delta_versions_reconstruct_bit_for_bit(server: WeightServer, ctx: Context) -> None:
    trainer, replica, address = _version_zero_held(server, ctx)
    full = replica.last_wire_bytes
    for version in range(1, 51):
        trainer.step()
        server.publish(version, trainer.named())
        _fetched_as_delta(replica, ctx, address, version, full, trainer)


def test_fetcher_that_skipped_versions_gets_a_composed_delta(
    server: WeightServer, ctx: Context
) -> None:
    trainer, replica, address = _version_zero_held(server, ctx)
    full = replica.last_wire_bytes
    for version in range(1, 5):  # 4 steps: within the default delta_window
        trainer.step()
        server.publish(version, trainer.named())
    _fetched_as_delta(replica, ctx, address, 4, full, trainer)


def test_fetcher_that_joins_late_gets_the_full_set_then_deltas(
    server: WeightServer, ctx: Context
) -> None:
    trainer = Trainer()
    address = server.addresses["weights"]
    for version in range(12):  # more versions than the delta window
        server.publish(version, trainer.named())
        trainer.step()
    late = Replica()
    assert _fetch(late, ctx, address) == 11
    full = late.last_wire_bytes
    server.publish(12, trainer.named())
    _fetched_as_delta(late, ctx, address, 12, full, trainer)


def test_wrong_base_content_is_refused_once_and_refetched_in_full(
    server: WeightServer, ctx: Context
) -> None:
    trainer, replica, address = _version_zero_held(server, ctx)
    replica.arrays["w1"] = replica.arrays["w1"].copy()
    replica.arrays["w1"].view(np.uint16)[0] ^= 1  # the held base is not what it claims
    trainer.step()
    server.publish(1, trainer.named())
    with capture_logs() as logs:
        assert _fetch(replica, ctx, address) == 1
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["weights.refused"]
    assert _same(replica, trainer.named())


class _BadPeer:
    """A weight server that answers the first delta request with a spoilt chunk, then
    serves the real full set: what a corrupt link or a faulty relay looks like."""

    def __init__(self, ctx: Context, v0: list, v1: list, spoil: str) -> None:
        self.server = Server(ctx, LOCAL, SETTINGS, SecuritySettings(), "bad-peer")
        self.v0 = build_snapshot(0, v0, SETTINGS)
        self.v1 = build_snapshot(1, v1, SETTINGS)
        self.spoil = spoil
        self.requests: list[WeightsRequest] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _delta_chunk(self) -> WeightsChunk:
        from grpo_stream.transport.delta import encode_delta

        names = [n for n, _ in self.v1.arrays]
        tensors = []
        for (_, old), (_, new) in zip(self.v0.arrays, self.v1.arrays, strict=True):
            payload = encode_delta(old, new, 3)
            assert payload is not None
            tensors.append(payload)
        if self.spoil == "truncated":
            tensors[0] = tensors[0][: tensors[0].nbytes // 2]
        base = 0 if self.spoil != "base" else 7
        return WeightsChunk(
            version=1, index=0, count=1, names=names, tensors=tensors, base=base,
            encodings=[XOR_ZSTD] * len(names), checksums=list(self.v1.checksums),
            checksum=self.v1.checksum,
        )  # fmt: skip

    def _serve(self) -> None:
        while not self.stop.is_set():
            got = self.server.recv(50)
            if got is None:
                continue
            peer, msg = got
            assert isinstance(msg, WeightsRequest)
            self.requests.append(msg)
            if msg.have < 0:
                chunks = self.v0.chunks if len(self.requests) == 1 else self.v1.chunks
            else:
                chunks = (self._delta_chunk(),)
            for chunk in chunks:
                self.server.send(peer, chunk)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.server.close()


@pytest.mark.parametrize("spoil", ["truncated", "base"])
def test_spoilt_delta_is_refused_once_never_applied_and_refetched_in_full(
    ctx: Context, spoil: str
) -> None:
    trainer = Trainer()
    v0 = trainer.named()
    trainer.step()
    v1 = trainer.named()
    peer = _BadPeer(ctx, v0, v1, spoil)
    replica = Replica()
    try:
        _fetch(replica, ctx, peer.server.address)
        with capture_logs() as logs:
            assert _fetch(replica, ctx, peer.server.address) == 1
    finally:
        peer.close()
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["weights.refused"]
    assert [r.have for r in peer.requests] == [-1, 0, -1]
    assert peer.requests[-1].direct
    assert _same(replica, v1)
