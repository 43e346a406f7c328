"""`grpo-stream keys init|add` through Typer's CliRunner."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from grpo_stream.cli.main import app

runner = CliRunner()


def test_keys_init_writes_keys_and_says_where(tmp_path: Path) -> None:
    result = runner.invoke(app, ["keys", "init", str(tmp_path / "k")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "k" / "server.key_secret").exists()
    assert (tmp_path / "k" / "authorized" / "client.key").exists()
    assert str(tmp_path / "k") in result.output


def test_keys_init_twice_fails_with_one_line(tmp_path: Path) -> None:
    runner.invoke(app, ["keys", "init", str(tmp_path)])
    result = runner.invoke(app, ["keys", "init", str(tmp_path)])
    assert result.exit_code != 0
    assert result.stderr.strip().count("\n") == 0
    assert "already exist" in result.stderr


def test_keys_init_force_overwrites(tmp_path: Path) -> None:
    runner.invoke(app, ["keys", "init", str(tmp_path)])
    before = (tmp_path / "server.key").read_bytes()
    result = runner.invoke(app, ["keys", "init", str(tmp_path), "--force"])
    assert result.exit_code == 0
    assert (tmp_path / "server.key").read_bytes() != before


def test_keys_add_allows_a_new_client(tmp_path: Path) -> None:
    runner.invoke(app, ["keys", "init", str(tmp_path)])
    result = runner.invoke(app, ["keys", "add", str(tmp_path), "host2"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "authorized" / "host2.key").exists()


def test_keys_add_without_init_fails(tmp_path: Path) -> None:
    result = runner.invoke(app, ["keys", "add", str(tmp_path), "host2"])
    assert result.exit_code != 0
    assert "keys init" in result.stderr


def test_keys_add_rejects_bad_name(tmp_path: Path) -> None:
    runner.invoke(app, ["keys", "init", str(tmp_path)])
    result = runner.invoke(app, ["keys", "add", str(tmp_path), "../evil"])
    assert result.exit_code != 0
    assert "invalid client name" in result.stderr


def test_keys_add_with_a_role_allows_that_role_only(tmp_path: Path) -> None:
    from grpo_stream.transport.curve import key_roles

    runner.invoke(app, ["keys", "init", str(tmp_path)])
    result = runner.invoke(app, ["keys", "add", str(tmp_path), "host2", "--role", "generator"])
    assert result.exit_code == 0, result.output
    public = (tmp_path / "host2.key").read_text().split('public-key = "')[1].split('"')[0]
    assert key_roles(tmp_path)[public] == "generator"


def test_keys_add_with_an_unknown_role_fails_with_one_line(tmp_path: Path) -> None:
    runner.invoke(app, ["keys", "init", str(tmp_path)])
    result = runner.invoke(app, ["keys", "add", str(tmp_path), "host2", "--role", "admin"])
    assert result.exit_code != 0
    assert "invalid role 'admin'" in result.stderr and result.stderr.strip().count("\n") == 0
