"""`up` checks the trainer's device settings before it starts any service."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from grpo_stream.cli.main import app


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_up_with_cuda_on_a_host_without_it_fails_in_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["up", "--run-dir", str(run_dir), "--set", 'trainer.device="cuda"']
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and 'trainer.device = "cuda"' in lines[0]
    assert not run_dir.exists()  # nothing started, nothing written


def test_up_with_a_budget_below_the_longest_sequence_fails_in_one_line(tmp_path: Path) -> None:
    args = ["up", "--run-dir", str(tmp_path / "run"), "--set", "trainer.micro_batch_tokens=8"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "trainer.micro_batch_tokens" in result.output
