"""`grpo-stream plan --cluster` through Typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from grpo_stream.cli.main import app

runner = CliRunner()
EXAMPLE = Path(__file__).parents[3] / "examples" / "cluster.toml"


def test_json_plan_puts_the_trainer_on_the_h100():
    result = runner.invoke(app, ["plan", "--cluster", str(EXAMPLE), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [t["device_id"] for t in data["trainer"]] == ["dgx-a:0"]
    shares = [g["share"] for g in data["generators"]]
    assert shares == sorted(shares, reverse=True)


def test_table_lists_roles_and_the_memory_rule():
    result = runner.invoke(app, ["plan", "--cluster", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert "trainer" in result.stdout
    assert "generator" in result.stdout
    assert "params x 18.0 B" in result.stdout


def test_a_bad_file_fails_with_one_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("model_params = 1000\n[[hosts]]\nname = 3\n")
    result = runner.invoke(app, ["plan", "--cluster", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: invalid cluster file")
    assert result.stderr.strip().count("\n") == 0


def test_a_missing_file_fails(tmp_path):
    result = runner.invoke(app, ["plan", "--cluster", str(tmp_path / "none.toml")])
    assert result.exit_code == 2
    assert "cluster file not found" in result.stderr


def test_a_model_too_large_fails_naming_the_memory_needed():
    result = runner.invoke(app, ["plan", "--cluster", str(EXAMPLE), "--model-params", "70B"])
    assert result.exit_code == 2
    assert "GiB for 70,000,000,000 params" in result.stderr
