"""`keys secret` (the run's secret, made once), `keys export` (one role's keys), and the
secret given to `grpo-stream run` in GRPO_STREAM_SECRET."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from grpo_stream.cli.main import app
from grpo_stream.hub.auth import load_secret
from grpo_stream.transport.curve import init_keys, key_roles, load_pair

runner = CliRunner()


def test_keys_secret_writes_a_private_secret_once(tmp_path: Path) -> None:
    path = tmp_path / "run" / "secret"
    assert runner.invoke(app, ["keys", "secret", str(path)]).exit_code == 0
    first = load_secret(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    kept = runner.invoke(app, ["keys", "secret", str(path)])
    assert kept.exit_code == 0 and "kept" in kept.output
    assert load_secret(path) == first
    assert runner.invoke(app, ["keys", "secret", str(path), "--force"]).exit_code == 0
    assert load_secret(path) != first
    assert sorted(p.name for p in path.parent.iterdir()) == ["secret"]  # no temp file left


def test_keys_secret_from_many_processes_at_once_leaves_one_whole_secret(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    cmd = [sys.executable, "-m", "grpo_stream.cli.main", "keys", "secret", str(path)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(6)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, outputs
    assert sum("wrote" in out for out in outputs) == 1, outputs  # the others kept it
    load_secret(path)  # whole: 64 hex characters, mode 0600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]


def test_keys_secret_refuses_a_readable_secret(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("ab" * 32 + "\n")
    path.chmod(0o644)
    result = runner.invoke(app, ["keys", "secret", str(path)])
    assert result.exit_code != 0 and "chmod 600" in result.output


def test_keys_export_copies_only_the_roles_keys(tmp_path: Path) -> None:
    init_keys(tmp_path / "keys")
    out = tmp_path / "gen"
    result = runner.invoke(app, ["keys", "export", str(tmp_path / "keys"), "generator", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "generator.key", "generator.key_secret", "server.key"]  # fmt: skip
    load_pair(out, "generator")
    hub = tmp_path / "hub"
    assert (
        runner.invoke(app, ["keys", "export", str(tmp_path / "keys"), "hub", str(hub)]).exit_code
        == 0
    )
    assert {p.name for p in hub.glob("*.key_secret")} == {"server.key_secret"}
    public, _ = load_pair(out, "generator")
    assert key_roles(hub)[public.decode()] == "generator"


def test_keys_export_refuses_an_unknown_role(tmp_path: Path) -> None:
    init_keys(tmp_path / "keys")
    result = runner.invoke(app, ["keys", "export", str(tmp_path / "keys"), "admin", str(tmp_path)])
    assert result.exit_code != 0 and "unknown role 'admin'" in result.output
