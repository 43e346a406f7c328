"""Socket wrappers over real ZeroMQ sockets on tcp://127.0.0.1 (port 0)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
from structlog.testing import capture_logs

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.protocols.messages import (
    Endpoints,
    Error,
    Hello,
    Shutdown,
    StatusRequest,
    WeightsAnnounce,
    WeightsChunk,
    Welcome,
    WorkRequest,
)
from grpo_stream.transport.errors import HandshakeRefused, HandshakeTimeout, SendTimeout
from grpo_stream.transport.sockets import (
    Announcer,
    Client,
    Context,
    Server,
    Subscriber,
    handshake,
)

LOCAL = "tcp://127.0.0.1:0"
PEER = Path(__file__).with_name("_peer.py")


def _hello() -> Hello:
    return Hello(service="generator", instance="g0", host="h", pid=1, capacity=2)


def _welcome() -> Welcome:
    peers = Endpoints(weights="tcp://h:1", announce="tcp://h:2")
    return Welcome(run_id="r1", config={}, config_digest="abc", peers=peers, policy_version=0)


@pytest.fixture
def hub(ctx: Context, settings: TransportSettings, plain: SecuritySettings) -> Iterator[Server]:
    """A plaintext server on a free loopback port, closed after the test."""
    server = Server(ctx, LOCAL, settings, plain, "hub")
    yield server
    server.close()


@pytest.fixture
def rogue(
    ctx: Context, hub: Server, settings: TransportSettings, plain: SecuritySettings
) -> Iterator[Client]:
    """A client of `hub` that sends what the test writes on its socket."""
    client = Client(ctx, hub.address, settings, plain, "rogue")
    yield client
    client.close()


def _recv_until(server: Server, deadline_s: float = 10.0) -> tuple[bytes, object]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        got = server.recv(50)
        if got is not None:
            return got
    raise AssertionError("nothing arrived")


def test_server_binds_port_zero_to_a_real_port(hub: Server) -> None:
    assert hub.address.startswith("tcp://127.0.0.1:")
    assert not hub.address.endswith(":0")


def test_request_reply_round_trip(
    ctx: Context, settings: TransportSettings, plain: SecuritySettings
) -> None:
    server = Server(ctx, LOCAL, settings, plain, "hub")
    client = Client(ctx, server.address, settings, plain, "gen-1")
    client.send(WorkRequest(instance="gen-1", credits=3))
    identity, msg = _recv_until(server)
    assert identity == b"gen-1"
    assert msg == WorkRequest(instance="gen-1", credits=3)
    assert server.send(identity, Shutdown(reason="done"))
    assert client.recv(5000) == Shutdown(reason="done")
    client.close()
    server.close()


def test_garbage_is_counted_logged_answered_and_server_keeps_serving(
    hub: Server, rogue: Client
) -> None:
    server, client = hub, rogue
    client.socket.send_multipart([b"\xc1 not msgpack", b"junk"])
    with capture_logs() as logs:
        deadline = time.monotonic() + 10
        while not server.rejected and time.monotonic() < deadline:
            assert server.recv(50) is None
    assert server.rejected == {"bad_header": 1}
    event = next(e for e in logs if e["event"] == "transport.rejected")
    assert event["code"] == "bad_header" and event["peer"] == "rogue"
    reply = client.recv(5000)
    assert isinstance(reply, Error) and reply.code == "bad_header"
    client.send(StatusRequest())
    assert _recv_until(server) == (b"rogue", StatusRequest())


def test_repeated_rejections_are_logged_once_and_all_counted(hub: Server, rogue: Client) -> None:
    server, client = hub, rogue
    for _ in range(3):
        client.socket.send_multipart([b"\xc1"])
    with capture_logs() as logs:
        deadline = time.monotonic() + 10
        while server.rejected["bad_header"] < 3 and time.monotonic() < deadline:
            server.recv(50)
    assert server.rejected["bad_header"] == 3
    assert [e["event"] for e in logs].count("transport.rejected") == 1


def test_frame_over_max_frame_bytes_is_dropped_before_delivery(
    ctx: Context, plain: SecuritySettings
) -> None:
    small = TransportSettings(max_frame_bytes=4096, max_message_bytes=8192, io_timeout_ms=2000)
    server = Server(ctx, LOCAL, small, plain, "hub")
    rogue = Client(ctx, server.address, small, plain, "rogue")
    rogue.socket.send_multipart([b"x" * 10_000])
    assert server.recv(300) is None
    honest = Client(ctx, server.address, small, plain, "honest")
    honest.send(StatusRequest())
    assert _recv_until(server) == (b"honest", StatusRequest())
    assert not server.rejected  # libzmq dropped it: the codec never saw it
    rogue.close()
    honest.close()
    server.close()


def test_send_to_unknown_peer_is_dropped_and_counted(hub: Server) -> None:
    with capture_logs() as logs:
        assert hub.send(b"nobody", Shutdown(reason="x")) is False
    assert hub.dropped == {"unreachable": 1}
    assert any(e["event"] == "transport.dropped" for e in logs)


def test_malformed_reply_to_client_is_counted_and_returns_none(
    ctx: Context, settings: TransportSettings, plain: SecuritySettings
) -> None:
    router = ctx.socket(zmq.ROUTER)
    router.bind(LOCAL)
    address = router.getsockopt_string(zmq.LAST_ENDPOINT)
    client = Client(ctx, address, settings, plain, "c1")
    client.send(StatusRequest())
    identity = router.recv_multipart()[0]
    router.send_multipart([identity, b"\x92\x01"])  # msgpack list, not a map
    assert client.recv(5000) is None
    assert client.rejected == {"bad_header": 1}
    client.close()
    router.close(linger=0)


def _hub_thread(
    ctx: Context, settings: TransportSettings, reply: Welcome | Error
) -> tuple[threading.Thread, str]:
    ready: list[str] = []
    started = threading.Event()

    def serve() -> None:
        server = Server(ctx, LOCAL, settings, SecuritySettings(), "hub")
        ready.append(server.address)
        started.set()
        try:
            identity, msg = _recv_until(server)
            assert isinstance(msg, Hello)
            server.send(identity, reply)
            time.sleep(0.2)  # let the reply leave before closing (linger is 0)
        finally:
            server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started.wait(10)
    return thread, ready[0]


def test_handshake_returns_welcome(ctx: Context, settings: TransportSettings) -> None:
    thread, address = _hub_thread(ctx, settings, _welcome())
    client = Client(ctx, address, settings, SecuritySettings(), "g0")
    assert handshake(client, _hello(), timeout_s=10) == _welcome()
    client.close()
    thread.join(10)


def test_handshake_error_reply_raises_refused_with_hub_message(
    ctx: Context, settings: TransportSettings
) -> None:
    refusal = Error(code="config_mismatch", message="config digest differs")
    thread, address = _hub_thread(ctx, settings, refusal)
    client = Client(ctx, address, settings, SecuritySettings(), "g0")
    with pytest.raises(HandshakeRefused, match="config digest differs") as info:
        handshake(client, _hello(), timeout_s=10)
    assert info.value.code == "config_mismatch"
    client.close()
    thread.join(10)


def test_handshake_timeout_names_address_and_setting(
    ctx: Context, settings: TransportSettings, plain: SecuritySettings
) -> None:
    silent = Server(ctx, LOCAL, settings, plain, "silent-hub")
    client = Client(ctx, silent.address, settings, plain, "g0")
    with pytest.raises(HandshakeTimeout) as info:
        handshake(client, _hello(), timeout_s=0.2)
    assert "transport.handshake_timeout_s" in str(info.value)
    assert "--handshake-timeout" in str(info.value)  # the flag a service takes
    assert silent.address in str(info.value)
    client.close()
    silent.close()


def test_handshake_with_a_client_in_another_process(
    ctx: Context, settings: TransportSettings, plain: SecuritySettings
) -> None:
    server = Server(ctx, LOCAL, settings, plain, "hub")
    child = subprocess.Popen(
        [sys.executable, str(PEER), "hello", server.address, settings.model_dump_json()],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        identity, msg = _recv_until(server, 60)
        assert isinstance(msg, Hello) and msg.service == "generator"
        server.send(identity, _welcome())
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    assert json.loads(out) == {
        "run_id": "r1",
        "peers": {"weights": "tcp://h:1", "announce": "tcp://h:2"},
    }
    server.close()


def test_subscriber_receives_what_announcer_publishes(
    ctx: Context, settings: TransportSettings, plain: SecuritySettings
) -> None:
    pub = Announcer(ctx, LOCAL, settings, plain, "announce")
    sub = Subscriber(ctx, pub.address, settings, plain, "watch")
    announce = WeightsAnnounce(version=3, num_tensors=2, total_bytes=64)
    got = None
    deadline = time.monotonic() + 10
    while got is None and time.monotonic() < deadline:  # subscriptions propagate lazily
        pub.publish(announce)
        got = sub.recv(50)
    assert got == announce
    sub.close()
    pub.close()


def test_socket_options_are_set_from_settings(ctx: Context, plain: SecuritySettings) -> None:
    tuned = TransportSettings(hwm=7, linger_ms=5, io_timeout_ms=123, max_frame_bytes=5000)
    server = Server(ctx, LOCAL, tuned, plain, "hub")
    opts = {o: server.socket.getsockopt(o) for o in (zmq.SNDHWM, zmq.RCVHWM, zmq.LINGER)}
    assert opts == {zmq.SNDHWM: 7, zmq.RCVHWM: 7, zmq.LINGER: 5}
    assert server.socket.getsockopt(zmq.RCVTIMEO) == 123
    assert server.socket.getsockopt(zmq.MAXMSGSIZE) == 5000
    server.close()


def test_client_send_with_no_room_raises_send_timeout_naming_setting(
    ctx: Context, plain: SecuritySettings
) -> None:
    tight = TransportSettings(hwm=1, io_timeout_ms=50)
    client = Client(ctx, "tcp://127.0.0.1:1", tight, plain, "lonely")  # nobody listens
    with pytest.raises(SendTimeout, match=r"transport\.io_timeout_ms"):
        for _ in range(10):
            client.send(StatusRequest())
    client.close()


def test_server_send_to_a_peer_at_its_hwm_is_dropped_not_blocked(
    ctx: Context, plain: SecuritySettings
) -> None:
    tight = TransportSettings(hwm=1, io_timeout_ms=2000)
    server = Server(ctx, LOCAL, tight, plain, "hub")
    reader = Client(ctx, server.address, tight, plain, "slow-reader")  # never reads
    reader.send(StatusRequest())
    identity, _ = _recv_until(server)
    chunk = WeightsChunk(version=1, index=0, count=1, names=["w"], tensors=[np.zeros(1 << 18)])
    sent = 0
    while server.send(identity, chunk) and sent < 1000:  # 2 MiB each, the same buffer
        sent += 1
    assert server.dropped["full"] == 1
    assert sent < 1000
    reader.close()
    server.close()
