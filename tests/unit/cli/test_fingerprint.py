"""`grpo-stream fingerprint` through Typer's CliRunner."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from grpo_stream.cli.main import app

runner = CliRunner()


def test_json_lists_this_hosts_devices_with_a_score():
    result = runner.invoke(app, ["fingerprint", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["devices"]
    assert all("score" in d for d in data["devices"])


def test_table_shows_a_recorded_device_with_estimates_marked():
    result = runner.invoke(app, ["fingerprint", "--recorded", "h100-sxm"])
    assert result.exit_code == 0, result.output
    assert "NVIDIA H100 80GB HBM3" in result.stdout
    assert "~3,352.3 GB/s" in result.stdout


def test_an_unknown_recording_fails_with_one_line():
    result = runner.invoke(app, ["fingerprint", "--recorded", "nope"])
    assert result.exit_code != 0
    assert result.stderr.strip().count("\n") == 0
    assert "no recorded fingerprint 'nope'" in result.stderr


def test_cli_modules_import_no_nvml_numpy_or_torch():
    code = (
        "import sys, grpo_stream.cli.fingerprint, grpo_stream.cli.plan;"
        "print(sorted(m for m in ('pynvml', 'numpy', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
