"""`grpo-stream run SERVICE` refuses bad input with one line before it starts anything; a
service takes `--handshake-timeout` (the flag its HandshakeTimeout names); the hub, which waits
for no Welcome, refuses it in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_stream.cli.main import app

runner = CliRunner()


def test_a_missing_secret_file_is_one_line_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "secret"
    args = ["run", "scorer", "--hub", "tcp://127.0.0.1:1", "--secret-file", str(missing)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert f"security.secret_file {missing}: cannot read it" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_service_waits_for_welcome_as_long_as_handshake_timeout_says(
    keep_signals: None,
) -> None:
    args = ["run", "scorer", "--hub", "tcp://127.0.0.1:1", "--handshake-timeout", "0.3"]
    result = runner.invoke(app, args)
    assert result.exit_code != 0
    assert "no Welcome from tcp://127.0.0.1:1 within 0.3 s" in result.output
    assert "--handshake-timeout" in result.output


def test_the_hub_refuses_handshake_timeout_in_one_line() -> None:
    result = runner.invoke(app, ["run", "grouper", "--handshake-timeout", "5"])
    assert result.exit_code != 0
    assert "--handshake-timeout is for services that join a hub" in result.output


def test_a_hub_bound_beyond_loopback_without_a_secret_is_one_line(tmp_path: Path) -> None:
    args = ["run", "grouper", "--set", f'run.run_dir="{tmp_path}"',
            "--set", 'hub.bind="tcp://0.0.0.0:0"']  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    line = result.output.strip()
    assert len(line.splitlines()) == 1, result.output
    assert "hub.bind=tcp://0.0.0.0:0 is reachable from other hosts" in line
    assert "security.secret_file" in line and "security.curve" in line
    assert not (tmp_path / "hub.addr").exists()  # nothing started


def test_a_short_secret_in_the_environment_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GRPO_STREAM_SECRET", "too-short")
    result = runner.invoke(app, ["run", "scorer", "--hub", "tcp://127.0.0.1:1"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: GRPO_STREAM_SECRET: 9 bytes, at least 32 needed"
