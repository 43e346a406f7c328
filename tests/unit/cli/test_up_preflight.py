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


def test_up_with_checkpointing_on_a_model_without_it_fails_in_one_line(tmp_path: Path) -> None:
    from transformers import CTRLConfig

    model = tmp_path / "ctrl"
    CTRLConfig(vocab_size=32, n_embd=16, n_layer=1, n_head=2, dff=32).save_pretrained(model)
    run_dir = tmp_path / "run"
    args = ["up", "--run-dir", str(run_dir), "--set", "trainer.gradient_checkpointing=true"]
    args += ["--set", f'model.name_or_path="{model}"']
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "trainer.gradient_checkpointing" in lines[0], result.output
    assert not run_dir.exists()  # nothing started, nothing written


def test_up_with_bf16_mixed_on_a_gpu_without_bf16_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch.cuda at its boundary: one visible GPU without bfloat16 (a T4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    run_dir = tmp_path / "run"
    args = ["up", "--run-dir", str(run_dir), "--set", 'trainer.device="cuda"']
    args += ["--set", 'trainer.precision="bf16-mixed"']
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "trainer.precision" in lines[0], result.output
    assert not run_dir.exists()  # nothing started, nothing written
