"""`grpo-stream up` with a two-rank trainer (torchrun, gloo on the CPU; DDP, FSDP2, then
both ranks splitting every sequence: trainer.context_parallel = 2) finishes a short run:
every step has its metrics and the final checkpoint loads with transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grpo_stream.training.metrics import REQUIRED, read_metrics

STEPS = 3
pytestmark = pytest.mark.slow  # over 20 s: torchrun, two ranks loading the model


RANKS = {
    "ddp": ["trainer.parallel=ddp"],
    "fsdp2": ["trainer.parallel=fsdp2"],
    "context": ["trainer.context_parallel=2"],
}
"""How the two ranks share the work."""


@pytest.fixture(scope="module", params=list(RANKS))
def finished_run(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    run_dir = tmp_path_factory.mktemp("ranks") / "run"
    # default heartbeats: two trainer ranks on a small shared CPU must not look lost
    sets = ["trainer.ranks=2", "trainer.micro_batch=4", "hub.groups_per_step=4",
            "generator.group_size=4", "generator.prompts_per_request=4",
            *RANKS[request.param]]  # fmt: skip
    cmd = [sys.executable, "-m", "grpo_stream.cli.main", "up", "--run-dir", str(run_dir),
           "--max-steps", str(STEPS)] + [a for s in sets for a in ("--set", s)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return run_dir


def test_two_rank_run_writes_metrics_for_every_step(finished_run: Path) -> None:
    rows = read_metrics(finished_run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(set(REQUIRED) <= set(r) for r in rows)


def test_two_rank_final_checkpoint_loads_with_transformers(finished_run: Path) -> None:
    from transformers import AutoModelForCausalLM

    ckpt = finished_run / "checkpoints" / f"step-{STEPS}"
    assert (ckpt / "COMPLETE").exists()
    assert AutoModelForCausalLM.from_pretrained(ckpt).num_parameters() > 0
