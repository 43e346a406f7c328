"""`grpo-stream run`: a service takes `--handshake-timeout` (the flag its HandshakeTimeout
names); the hub, which waits for no Welcome, refuses it in one line."""

from __future__ import annotations

from typer.testing import CliRunner

from grpo_stream.cli.main import app


def test_a_service_waits_for_welcome_as_long_as_handshake_timeout_says(
    keep_signals: None,
) -> None:
    args = ["run", "scorer", "--hub", "tcp://127.0.0.1:1", "--handshake-timeout", "0.3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert "no Welcome from tcp://127.0.0.1:1 within 0.3 s" in result.output
    assert "--handshake-timeout" in result.output


def test_the_hub_refuses_handshake_timeout_in_one_line() -> None:
    result = CliRunner().invoke(app, ["run", "grouper", "--handshake-timeout", "5"])
    assert result.exit_code != 0
    assert "--handshake-timeout is for services that join a hub" in result.output
