"""`grpo-stream security-check`: bad input is one line and a non-zero exit; the verdict lines
read HELD, BROKEN or SKIPPED. Against a live run: tests/e2e/test_strangers.py."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from grpo_stream.cli.main import app
from grpo_stream.securitycheck import Verdict


def test_a_directory_without_a_live_hub_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["security-check", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {tmp_path} has no hub.addr: is a run live there?"


def test_each_verdict_is_one_line_naming_its_attack() -> None:
    assert Verdict("a", True, "refused (x)").line() == "HELD    a: refused (x)"
    assert Verdict("b", False, "welcomed").line() == "BROKEN  b: welcomed"
    assert Verdict("c", None, "no generator").line() == "SKIPPED c: no generator"
