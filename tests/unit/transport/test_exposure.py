"""Nothing binds beyond loopback unguarded: one line naming the settings."""

from __future__ import annotations

import pytest

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.transport.errors import ExposedBind
from grpo_stream.transport.exposure import exposure_error
from grpo_stream.transport.sockets import Server, close_context, make_context

LOOPBACK = ["tcp://127.0.0.1:0", "tcp://127.0.3.4:5", "tcp://localhost:7", "tcp://[::1]:9",
            "ipc:///tmp/x.sock", "inproc://a"]  # fmt: skip
EXPOSED = ["tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://10.1.2.3:0", "tcp://hub-host:5555"]


@pytest.mark.parametrize("address", LOOPBACK)
def test_loopback_binds_need_nothing(address: str) -> None:
    assert exposure_error(address, SecuritySettings(), False, "hub.bind") == ""


@pytest.mark.parametrize("address", EXPOSED)
def test_an_exposed_bind_needs_the_secret_or_curve(address: str) -> None:
    why = exposure_error(address, SecuritySettings(), False, "hub.bind")
    assert f"hub.bind={address}" in why and "security.secret_file" in why
    assert "security.curve" in why and "\n" not in why
    assert exposure_error(address, SecuritySettings(), True, "hub.bind") == ""


def test_a_server_refuses_to_bind_exposed_without_a_guard() -> None:
    ctx = make_context()
    try:
        with pytest.raises(ExposedBind, match=r"trainer\.bind=tcp://0\.0\.0\.0:0"):
            Server(ctx, "tcp://0.0.0.0:0", TransportSettings(), SecuritySettings(), "weights",
                   setting="trainer.bind")  # fmt: skip
        server = Server(ctx, "tcp://0.0.0.0:0", TransportSettings(), SecuritySettings(),
                        "weights", guarded=True)  # fmt: skip
        server.close()
    finally:
        close_context(ctx)
