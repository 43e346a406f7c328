"""Fuzzing one ROUTER at the socket level, without a run: what a malformed message costs the
server before it is refused (a huge declared array allocates nothing; a frame over
transport.max_frame_bytes never reaches Python) and that it keeps serving. The fuzzing of a
live run's hub and weight server is tests/e2e/test_fuzz.py.
"""

from __future__ import annotations

import tracemalloc
from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import PROTO_VERSION, decode, encode
from grpo_stream.transport.sockets import Server, close_context, make_context


@pytest.fixture
def server() -> Iterator[Server]:
    ctx = make_context()
    settings = TransportSettings(max_frame_bytes=4096, max_message_bytes=8192)
    srv = Server(ctx, "tcp://127.0.0.1:0", settings, SecuritySettings(), name="fuzz")
    yield srv
    srv.close()
    close_context(ctx)


def _dealer(address: str) -> tuple[zmq.Context[Any], zmq.Socket[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return ctx, sock


def test_huge_declared_array_is_rejected_without_allocating(server: Server) -> None:
    meta = {"dtype": "float64", "shape": [2**26]}  # 512 MiB declared, 8 bytes sent
    head = {"proto": PROTO_VERSION, "kind": "weights_chunk", "version": 1, "index": 0, "count": 1,
            "names": ["w"], "tensors": [meta], "base": -1, "encodings": ["raw"],
            "checksums": [0], "checksum": 0}  # fmt: skip
    ctx, sock = _dealer(server.address)
    sock.send_multipart([msgpack.packb(head), b"\0" * 8])  # warms caches and the log throttle
    assert server.recv(timeout_ms=5000) is None
    sock.send_multipart([msgpack.packb(head), b"\0" * 8])
    assert server.socket.poll(5000)
    tracemalloc.start()
    try:
        assert server.recv(timeout_ms=1000) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert server.rejected == Counter({"bad_array": 2})
    for _ in range(2):
        assert sock.poll(5000)
        reply = decode(sock.recv_multipart())
        assert isinstance(reply, m.Error) and reply.code == "bad_array"
    sock.close()
    ctx.term()


def test_frame_over_the_limit_never_reaches_python_and_server_keeps_serving(
    server: Server,
) -> None:
    ctx, big = _dealer(server.address)
    big.send_multipart([b"\x80" * 10_000])  # over max_frame_bytes: libzmq drops the peer
    assert server.recv(timeout_ms=500) is None
    assert not server.rejected
    good_ctx, good = _dealer(server.address)
    good.send_multipart([bytes(f) for f in encode(m.StatusRequest())])
    got = server.recv(timeout_ms=5000)
    assert got is not None and isinstance(got[1], m.StatusRequest)
    for sock, c in ((big, ctx), (good, good_ctx)):
        sock.close()
        c.term()
