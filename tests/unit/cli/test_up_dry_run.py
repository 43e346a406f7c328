"""`grpo-stream up --dry-run` through Typer's CliRunner, NVML replaced by recordings."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_stream.cli.main import app
from grpo_stream.hardware.recorded import RecordedNvml, load_record

runner = CliRunner()


@pytest.fixture
def eight_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import pynvml` answers with eight recorded H100s (the hardware boundary)."""
    monkeypatch.setitem(sys.modules, "pynvml", RecordedNvml([load_record("h100-sxm")] * 8))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _blocks(output: str) -> dict[str, tuple[str, str]]:
    """instance -> (its first line, its env line) of the dry run."""
    lines = output.splitlines()
    return {
        line.split()[0]: (line, lines[i + 1].strip())
        for i, line in enumerate(lines)
        if " host=" in line
    }


def test_dry_run_prints_each_service_with_its_devices(eight_h100: None, tmp_path: Path) -> None:
    args = ["up", "--dry-run", "--run-dir", str(tmp_path / "run"), "--set", "trainer.ranks=2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    blocks = _blocks(result.stdout)
    assert list(blocks) == [
        "grouper-0",
        "trainer-0",
        *[f"generator-{i}" for i in range(6)],
        "scorer-0",
    ]
    assert blocks["trainer-0"][1] == "env: CUDA_VISIBLE_DEVICES=0,1 CUDA_DEVICE_ORDER=PCI_BUS_ID"
    assert "ranks=2" in blocks["trainer-0"][0]
    assert blocks["generator-5"][1].startswith("env: CUDA_VISIBLE_DEVICES=7 ")
    assert blocks["scorer-0"][1].startswith("env: CUDA_VISIBLE_DEVICES= ")


def test_dry_run_starts_nothing_and_writes_nothing(eight_h100: None, tmp_path: Path) -> None:
    result = runner.invoke(app, ["up", "--dry-run", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "run").exists()


def test_a_gpu_that_does_not_exist_fails_before_anything_starts(
    eight_h100: None, tmp_path: Path
) -> None:
    args = ["up", "--run-dir", str(tmp_path / "run"), "--set", 'run.placement="manual"',
            "--set", "trainer.devices=[8]", "--set", "generator.devices=[1]"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: trainer.devices names GPU 8, but local has 8 GPU(s): 0-7"
    )
    assert not (tmp_path / "run" / "config.toml").exists()


def test_dry_run_gives_every_service_the_runs_secret(eight_h100: None, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["up", "--dry-run", "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    cmds = [line for line in result.stdout.splitlines() if line.strip().startswith("cmd:")]
    clients = [c for c in cmds if " run grouper " not in c]
    assert clients and all(f"--secret-file {run_dir / 'secret'}" in c for c in clients)
    assert not (run_dir / "secret").exists()  # a dry run writes nothing
