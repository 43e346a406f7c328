"""`grpo-stream up --task calc` end to end: real services, the sandboxed calc environment,
the shipped tiny-calc model; every episode group ends exactly once and training moves the
weights."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from grpo_stream.training.metrics import read_metrics

from .conftest import SMALL, up_command

STEPS = 3
GROUPS = 4  # hub.groups_per_step in SMALL
EPISODES = 4  # generator.group_size in SMALL


@pytest.fixture(scope="module")
def calc_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("calc") / "run"
    cmd = up_command(run_dir, STEPS, "--task", "calc", settings=SMALL)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_every_episode_group_ends_once_and_each_step_trains_whole_groups(calc_run: Path) -> None:
    counters = json.loads((calc_run / "hub" / "counters.json").read_text())
    done = sum(counters[k] for k in ("trained", "filtered", "stale", "failed", "discarded"))
    assert counters["dispatched"] == done + counters["in_progress"]
    assert counters["failed"] == 0 and counters["duplicates_dropped"] == 0
    rows = read_metrics(calc_run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert counters["trained"] == GROUPS * STEPS
    for row in rows:
        assert row["groups_trained"] == GROUPS * row["step"]  # a running total
        assert row["sequences"] == GROUPS * EPISODES  # one trajectory per episode
        assert 0.0 <= row["reward_mean"] <= 1.0 and math.isfinite(row["reward_mean"])


@pytest.mark.slow
def test_calc_training_changes_the_tiny_calc_parameters(calc_run: Path) -> None:
    from transformers import AutoModelForCausalLM

    from grpo_stream.models.loading import resolve_model

    ckpt = calc_run / "checkpoints" / f"step-{STEPS}"
    trained = AutoModelForCausalLM.from_pretrained(ckpt)
    initial = AutoModelForCausalLM.from_pretrained(resolve_model("grpo-stream/tiny-calc"))
    before = dict(initial.named_parameters())
    assert [n for n, p in trained.named_parameters() if not torch.equal(p, before[n])]
