"""Metric sinks: TensorBoard event files and an offline W&B run hold the step's numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_stream.training.sinks import make_sinks

ROW = {
    "step": 3,
    "reward_mean": 0.5,
    "loss": 0.1,
    "reg_fired": True,
    "gen_tokens_per_s": {"g": 1.0},
}


def test_tensorboard_sink_writes_scalars(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (sink,) = make_sinks(["tensorboard"], tmp_path, {})
    sink.write(3, ROW)
    sink.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert "reward_mean" in acc.Tags()["scalars"]
    assert acc.Scalars("reward_mean")[0].value == pytest.approx(0.5)
    assert "reg_fired" not in acc.Tags()["scalars"]


def test_wandb_sink_logs_offline_to_the_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    (sink,) = make_sinks(["wandb"], tmp_path, {"trainer": {"lr": 1e-4}})
    sink.write(3, ROW)
    sink.close()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
