"""Weight server and fetcher over real sockets (and a fetch from another process)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.models.testing import tiny_gpt2
from grpo_stream.protocols.arrays import to_torch
from grpo_stream.protocols.codec import decode, encode
from grpo_stream.protocols.messages import WeightsChunk, WeightsRequest
from grpo_stream.transport.errors import WeightsError, WeightsTimeout
from grpo_stream.transport.fetch import Replica, WeightsWatcher, fetch_weights
from grpo_stream.transport.sockets import Context, Server
from grpo_stream.transport.weights import WeightServer

LOCAL = "tcp://127.0.0.1:0"
PEER = Path(__file__).with_name("_peer.py")


@pytest.fixture
def small_chunks() -> TransportSettings:
    return TransportSettings(io_timeout_ms=2000, weights_chunk_bytes=4096)


@pytest.fixture
def weights(ctx: Context, small_chunks: TransportSettings) -> Iterator[WeightServer]:
    server = WeightServer(ctx, LOCAL, LOCAL, small_chunks, SecuritySettings())
    yield server
    server.close()


def _tiny_model() -> torch.nn.Module:
    torch.set_num_threads(1)
    model: torch.nn.Module = tiny_gpt2(vocab=64, hidden=32, layers=2, positions=16, train=True)
    return model


def _filled(version: int, n: int = 8, numel: int = 256 * 1024) -> list[tuple[str, torch.Tensor]]:
    return [(f"t{i}", torch.full((numel,), float(version))) for i in range(n)]


def test_fetch_in_another_process_returns_equal_tensors(
    weights: WeightServer, small_chunks: TransportSettings, tmp_path: Path
) -> None:
    model = _tiny_model()
    snapshot = weights.publish(1, model.state_dict().items())
    assert len(snapshot.chunks) > 1
    out = tmp_path / "fetched.npz"
    args = ["fetch", weights.addresses["weights"], small_chunks.model_dump_json(), str(out)]
    done = subprocess.run(
        [sys.executable, str(PEER), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["version"] == 1
    state = model.state_dict()
    with np.load(out, allow_pickle=False) as fetched:
        assert sorted(fetched.files) == sorted(result["names"])
        for name in result["names"]:
            assert torch.equal(torch.from_numpy(fetched[name]), state[name]), name


def test_tied_weights_are_sent_once(weights: WeightServer, ctx: Context) -> None:
    model = _tiny_model()
    snapshot = weights.publish(1, model.state_dict().items())
    assert snapshot.aliases == {"lm_head.weight": "transformer.wte.weight"}
    _, tensors = fetch_weights(ctx, weights.addresses["weights"], weights_settings(), _plain())
    names = [n for n, _ in tensors]
    assert "transformer.wte.weight" in names and "lm_head.weight" not in names
    assert len(names) == len(set(names)) == len(model.state_dict()) - 1


def test_snapshot_is_a_copy_unaffected_by_later_training(
    weights: WeightServer, ctx: Context
) -> None:
    params = [("w", torch.ones(4, 4))]
    weights.publish(5, params)
    params[0][1].add_(1.0)  # the trainer keeps training in place
    version, tensors = fetch_weights(
        ctx, weights.addresses["weights"], weights_settings(), _plain()
    )
    assert version == 5
    assert torch.equal(to_torch(tensors[0][1]), torch.ones(4, 4))


def test_bfloat16_tensors_round_trip(weights: WeightServer, ctx: Context) -> None:
    tensor = torch.randn(3, 5).to(torch.bfloat16)
    weights.publish(1, [("b", tensor)])
    _, tensors = fetch_weights(ctx, weights.addresses["weights"], weights_settings(), _plain())
    assert torch.equal(to_torch(tensors[0][1]), tensor)


def test_non_contiguous_tensor_arrives_in_logical_order(
    weights: WeightServer, ctx: Context
) -> None:
    tensor = torch.arange(12.0).reshape(3, 4).t()
    weights.publish(1, [("t", tensor)])
    _, tensors = fetch_weights(ctx, weights.addresses["weights"], weights_settings(), _plain())
    assert torch.equal(to_torch(tensors[0][1]), tensor)


def test_stream_in_progress_keeps_its_version_after_a_new_publish(ctx: Context) -> None:
    # HWM 1, 1 MiB chunks, a 64 KiB receive buffer and 16 MiB per version: the server
    # cannot queue the whole of v1 before v2 is published.
    tight = TransportSettings(hwm=1, io_timeout_ms=2000, weights_chunk_bytes=1 << 20)
    server = WeightServer(ctx, LOCAL, LOCAL, tight, _plain())
    server.publish(1, _filled(1, n=16))
    slow = ctx.socket(zmq.DEALER)
    slow.rcvhwm, slow.rcvbuf, slow.linger = 1, 64 * 1024, 0
    slow.connect(server.addresses["weights"])
    slow.send_multipart(encode(WeightsRequest(version=-1)))
    first = decode(slow.recv_multipart())
    assert isinstance(first, WeightsChunk) and first.version == 1
    assert server.served == 0  # v1 is still streaming
    server.publish(2, _filled(2, n=16))
    chunks = [first] + [decode(slow.recv_multipart()) for _ in range(first.count - 1)]
    assert all(isinstance(c, WeightsChunk) and c.version == 1 for c in chunks)
    assert sorted(c.index for c in chunks) == list(range(first.count))
    assert all(float(t[0]) == 1.0 for c in chunks for t in c.tensors)
    version, _ = fetch_weights(ctx, server.addresses["weights"], tight, _plain())
    assert version == 2
    slow.close()
    server.close()


def test_request_for_a_version_no_longer_held_gets_the_current_one(
    weights: WeightServer, ctx: Context
) -> None:
    weights.publish(1, _filled(1, n=2, numel=4))
    weights.publish(2, _filled(2, n=2, numel=4))
    version, tensors = fetch_weights(
        ctx, weights.addresses["weights"], weights_settings(), _plain(), version=1
    )
    assert version == 2
    assert all(float(a[0]) == 2.0 for _, a in tensors)


def test_repeated_requests_for_an_old_version_are_logged_rate_limited(
    weights: WeightServer, ctx: Context
) -> None:
    from structlog.testing import capture_logs

    weights.publish(1, _filled(1, n=1, numel=4))
    weights.publish(2, _filled(2, n=1, numel=4))
    with capture_logs() as logs:
        for _ in range(20):  # what any peer on the port can repeat
            fetch_weights(ctx, weights.addresses["weights"], weights_settings(), _plain(), 1)
    said = [e for e in logs if e["event"] == "weights.request_redirected"]
    assert len(said) == 1 and said[0]["count"] == 1


def test_fetch_before_any_publish_raises_weights_error(weights: WeightServer, ctx: Context) -> None:
    with pytest.raises(WeightsError, match="no weights"):
        fetch_weights(ctx, weights.addresses["weights"], weights_settings(), _plain())


def test_fetch_timeout_names_the_address(ctx: Context) -> None:
    silent = Server(ctx, LOCAL, weights_settings(), _plain(), "silent")
    with pytest.raises(WeightsTimeout, match=re.escape(silent.address)):
        fetch_weights(ctx, silent.address, weights_settings(), _plain(), timeout_s=0.2)
    silent.close()


def test_tensor_over_frame_limit_is_refused_naming_the_setting(ctx: Context) -> None:
    tiny = TransportSettings(max_frame_bytes=1024, max_message_bytes=1 << 20)
    server = WeightServer(ctx, LOCAL, LOCAL, tiny, _plain())
    with pytest.raises(WeightsError, match=r"transport\.max_frame_bytes"):
        server.publish(1, [("big", torch.zeros(1024))])
    assert server.version is None
    server.close()


def test_watcher_reports_the_latest_announced_version(weights: WeightServer, ctx: Context) -> None:
    watcher = WeightsWatcher(ctx, weights.addresses["announce"], weights_settings(), _plain())
    seen = None
    deadline = time.monotonic() + 10
    version = 0
    while seen is None and time.monotonic() < deadline:  # until the subscription is live
        version += 1
        weights.publish(version, [("w", torch.zeros(2))])
        seen = watcher.poll(timeout_ms=100)
    weights.publish(version + 1, [("w", torch.zeros(2))])
    weights.publish(version + 2, [("w", torch.zeros(2))])
    deadline = time.monotonic() + 10
    while seen != version + 2 and time.monotonic() < deadline:
        seen = watcher.poll(timeout_ms=100)
    assert seen == version + 2
    watcher.close()


def weights_settings() -> TransportSettings:
    return TransportSettings(io_timeout_ms=2000, weights_chunk_bytes=4096)


def _plain() -> SecuritySettings:
    return SecuritySettings()


class KillOnFirstChunk:
    """A relay sink (the fetcher's hook for each chunk) that SIGKILLs the weight server's
    process when the first chunk of the version arrives: a server dying mid-transfer."""

    address = "tcp://127.0.0.1:1"
    claim = ""  # no secret: the server makes it no relay (it has none)

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.killed_at: float | None = None

    def expect(self, version: int, base: int) -> None:
        pass

    def offer(self, chunk: WeightsChunk) -> None:
        if self.killed_at is None:
            self.proc.kill()
            self.proc.wait()
            self.killed_at = time.monotonic()

    def abort(self) -> None:
        pass


def test_a_server_killed_mid_fetch_fails_it_after_fetch_stall_s_not_the_deadline(
    ctx: Context,
) -> None:
    # 16 chunks of 1 MiB, one message in flight per queue: most of them are still unsent
    # (in no socket buffer) when the server dies
    small = TransportSettings(io_timeout_ms=2000, weights_chunk_bytes=1 << 18, hwm=1)
    proc = subprocess.Popen(
        [sys.executable, str(PEER), "serve", LOCAL, small.model_dump_json(), "16"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        address = json.loads(proc.stdout.readline())["weights"]
        sink = KillOnFirstChunk(proc)
        with pytest.raises(WeightsTimeout, match=r"nothing for 1 s") as err:
            Replica().fetch(
                ctx, address, small, _plain(), timeout_s=60.0,
                weights=WeightsSettings(fetch_stall_s=1.0), relay=sink,
            )  # fmt: skip
        assert sink.killed_at is not None, err
        assert time.monotonic() - sink.killed_at < 10  # not the whole fetch's 60 s
    finally:
        proc.kill()
        proc.wait()
