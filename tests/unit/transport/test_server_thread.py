"""ServerThread: one lifecycle for every ROUTER served from its own thread."""

from __future__ import annotations

import threading
import time

import pytest
import zmq
from structlog.testing import capture_logs

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.protocols.messages import Error, StatusRequest
from grpo_stream.transport.errors import TransportError
from grpo_stream.transport.server_thread import ServerThread
from grpo_stream.transport.sockets import Client, Context, Server, make_context


def _echo(server: Server, stop: threading.Event) -> None:
    while not stop.is_set():
        got = server.recv(20)
        if got is not None:
            peer, msg = got
            server.send(peer, Error(code="echo", message=msg.KIND))


def test_it_binds_serves_from_its_thread_and_stops_on_close() -> None:
    ctx = make_context()
    try:
        serving = ServerThread(
            ctx, "tcp://127.0.0.1:0", TransportSettings(), SecuritySettings(), "echo", _echo
        )
        assert serving.address.startswith("tcp://127.0.0.1:")
        assert not serving.address.endswith(":0")  # the port is resolved before it returns
        client = Client(ctx, serving.address, TransportSettings(), SecuritySettings(), "c1")
        client.send(StatusRequest())
        reply = client.recv(5000)
        assert isinstance(reply, Error) and (reply.code, reply.message) == (
            "echo",
            "status_request",
        )
        client.close()
        serving.close()
        assert not serving.alive()
    finally:
        ctx.term()


def test_a_bind_that_fails_is_one_error_naming_the_server_and_address() -> None:
    ctx = make_context()
    first = ServerThread(
        ctx, "tcp://127.0.0.1:0", TransportSettings(), SecuritySettings(), "echo", _echo
    )
    try:
        with pytest.raises(
            TransportError, match=f"payloads server failed to start on {first.address}"
        ):
            ServerThread(
                ctx, first.address, TransportSettings(), SecuritySettings(), "payloads", _echo
            )
    finally:
        first.close()
        ctx.term()


def test_a_serve_that_raises_is_logged_recorded_and_its_socket_closed() -> None:
    def broken(server: Server, stop: threading.Event) -> None:
        raise RuntimeError("boom")

    ctx = make_context()
    try:
        with capture_logs() as logs:
            serving = ServerThread(
                ctx, "tcp://127.0.0.1:0", TransportSettings(), SecuritySettings(), "relay", broken
            )
            deadline = time.monotonic() + 5.0
            while serving.alive() and time.monotonic() < deadline:
                time.sleep(0.01)
        assert not serving.alive()
        assert isinstance(serving.failure, RuntimeError)
        assert any(e["event"] == "relay.server_failed" for e in logs)
        # the socket was closed: its port can be bound again (ZeroMQ releases a closed
        # socket's port on its I/O thread, a moment after close returns)
        assert _binds_again(ctx, serving.address)
    finally:
        ctx.term()


def _binds_again(ctx: Context, address: str) -> bool:
    deadline = time.monotonic() + 10.0
    while True:
        sock = ctx.socket(zmq.ROUTER)
        try:
            sock.bind(address)
            return True
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        finally:
            sock.close(linger=0)
