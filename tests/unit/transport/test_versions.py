"""The weight server's step deltas are computed off the publishing (trainer's) thread, and
a deferred delta is the same delta as one computed at publish time."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.transport import versions
from grpo_stream.transport.fetch import Replica
from grpo_stream.transport.sockets import Context
from grpo_stream.transport.versions import DeltaHistory
from grpo_stream.transport.weights import WeightServer, build_snapshot

LOCAL = "tcp://127.0.0.1:0"
SETTINGS = TransportSettings(io_timeout_ms=2000, weights_chunk_bytes=16 * 1024)


def _weights(step: int) -> list[tuple[str, torch.Tensor]]:
    """Two bf16 tensors that move a little each step (most bits stay: deltas compress)."""
    rng = np.random.default_rng(0)
    base = [torch.from_numpy(rng.normal(size=(64, 64)).astype(np.float32)) for _ in range(2)]
    return [(f"w{i}", (b + 1e-3 * step * b.sign()).to(torch.bfloat16)) for i, b in enumerate(base)]


def test_publish_leaves_the_step_delta_to_another_thread(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    encode = versions.encode_delta

    def spy(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return encode(*args)

    monkeypatch.setattr(versions, "encode_delta", spy)
    server = WeightServer(ctx, LOCAL, LOCAL, SETTINGS, SecuritySettings(), WeightsSettings())
    try:
        replica = Replica()
        address = server.addresses["weights"]
        server.publish(0, _weights(0))
        replica.fetch(ctx, address, SETTINGS, SecuritySettings(), timeout_s=20)
        full = replica.last_wire_bytes
        server.publish(1, _weights(1))
        assert replica.fetch(ctx, address, SETTINGS, SecuritySettings(), timeout_s=20) == 1
        assert replica.last_wire_bytes < full  # it still came as a delta
    finally:
        server.close()
    assert threads and threading.main_thread().name not in threads


def test_a_deferred_delta_equals_the_delta_recorded_at_once() -> None:
    a, b, c = (build_snapshot(v, _weights(v), SETTINGS) for v in range(3))
    eager, deferred = DeltaHistory(4, 3, SETTINGS), DeltaHistory(4, 3, SETTINGS)
    eager.record(a, b)
    eager.record(b, c)
    deferred.defer(a, b)
    deferred.defer(b, c)
    assert deferred.bases() == eager.bases() == [0, 1]
    for have in (0, 1):
        got, want = deferred.chunks_from(have, c), eager.chunks_from(have, c)
        assert got is not None and want is not None
        for x, y in zip(got, want, strict=True):
            assert x.encodings == y.encodings
            assert all(np.array_equal(s, t) for s, t in zip(x.tensors, y.tensors, strict=True))


def _fp32(version: int, changed: int) -> list[tuple[str, torch.Tensor]]:
    """An fp32 tensor whose first `changed` elements moved by a relative 1e-3 at `version`
    (every element changed: its low bytes are noise and the XOR hardly compresses)."""
    rng = np.random.default_rng(0)
    w = torch.from_numpy(rng.normal(size=64 * 64).astype(np.float32))
    w[:changed] *= 1 + 1e-3 * version
    return [("w", w.reshape(64, 64))]


def test_a_step_delta_over_the_max_ratio_of_the_full_set_is_not_used() -> None:
    a, b = (build_snapshot(v, _fp32(v, 64 * 64), SETTINGS) for v in range(2))
    bounded, unbounded = (DeltaHistory(4, 3, SETTINGS, max_ratio=r) for r in (0.5, 1.0))
    for history in (bounded, unbounded):
        history.record(a, b)
    assert unbounded.chunks_from(0, b) is not None  # smaller than the set, yet over half
    assert bounded.chunks_from(0, b) is None  # so the fetcher gets the full set


def test_after_a_delta_that_did_not_pay_deltas_are_tried_again_every_probe_interval() -> None:
    history = DeltaHistory(4, 3, SETTINGS, max_ratio=0.5)
    snaps = [build_snapshot(0, _fp32(0, 64 * 64), SETTINGS)]
    snaps.append(build_snapshot(1, _fp32(1, 64 * 64), SETTINGS))  # every element: no pay
    for v in range(2, versions.PROBE_EVERY + 3):
        snaps.append(build_snapshot(v, _fp32(v, 1), SETTINGS))  # one element: pays well
    history.record(snaps[0], snaps[1])
    for v in range(2, versions.PROBE_EVERY + 1):  # the publishes after it: in full
        history.record(snaps[v - 1], snaps[v])
        assert history.chunks_from(v - 1, snaps[v]) is None
    v = versions.PROBE_EVERY + 1  # tried again: it pays, deltas are back
    history.record(snaps[v - 1], snaps[v])
    assert history.chunks_from(v - 1, snaps[v]) is not None
