"""`grpo-stream run SERVICE` refuses bad input with one line before it starts anything."""

from __future__ import annotations

from pathlib import Path

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
