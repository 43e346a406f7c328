"""`grpo-stream up` on a local GSM8K-shaped Parquet file with answer_regex, held-out
evaluation by the evaluator service, and bad data refused before any service starts."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest
import torch

from grpo_stream.rundir.evals import read_eval
from grpo_stream.services.evaluator import next_due
from grpo_stream.training.metrics import read_metrics

from .conftest import SMALL, up_command

STEPS = 6
EVERY = 3


def gsm8k_parquet(path: Path) -> Path:
    """a+b problems in GSM8K's shape: a worked answer ending in `#### <number>`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pairs = [(a, b) for a in range(21) for b in range(21)]
    pq.write_table(
        pa.table(
            {
                "question": [f"{a}+{b}=" for a, b in pairs],
                "answer": [f"{a} plus {b} makes {a + b}.\n#### {a + b}" for a, b in pairs],
            }
        ),
        path,
    )
    return path


def data_settings(data: Path) -> list[str]:
    return [
        "--set",
        'task.name="dataset"',
        "--set",
        f'task.dataset="{data}"',
        "--set",
        'task.answer_regex="####\\\\s*(.+)$"',
        "--set",
        'task.rewards=[{name="exact_match"}]',
        "--set",
        "task.holdout=0.1",
    ]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    data = gsm8k_parquet(root / "gsm.parquet")
    evals = ["--set", f"eval.every={EVERY}", "--set", "eval.problems=8", "--set", "eval.k=2"]
    cmd = up_command(root / "run", STEPS, *data_settings(data), *evals, settings=SMALL)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "run"


@pytest.mark.slow
def test_a_parquet_run_trains_every_step_and_changes_the_weights(finished_run: Path) -> None:
    from transformers import AutoModelForCausalLM

    from grpo_stream.models.loading import resolve_model

    assert [r["step"] for r in read_metrics(finished_run)] == list(range(1, STEPS + 1))
    trained = AutoModelForCausalLM.from_pretrained(finished_run / "checkpoints" / f"step-{STEPS}")
    initial = AutoModelForCausalLM.from_pretrained(resolve_model("grpo-stream/tiny-arith"))
    before = dict(initial.named_parameters())
    assert any(not torch.equal(p, before[n]) for n, p in trained.named_parameters())


@pytest.mark.slow
def test_the_evaluator_writes_held_out_results_as_training_runs(finished_run: Path) -> None:
    rows = read_eval(finished_run)
    steps = [r["step"] for r in rows]
    # the initial weights, then each time a version at or past the next multiple of EVERY
    # (one published while it evaluates is not queued: services/evaluator.py)
    assert steps[0] == 0 and len(steps) >= 2
    for before, after in itertools.pairwise(steps):
        assert after >= next_due(before, EVERY)
    for row in rows:
        assert {"eval/pass@1", "eval/pass@k", "eval/reward"} <= set(row)
        assert row["eval/problems"] == 8
    assert (finished_run / "report.png").exists()


def test_a_missing_field_fails_in_one_line_before_services_start(tmp_path: Path) -> None:
    data = gsm8k_parquet(tmp_path / "gsm.parquet")
    cmd = [
        *up_command(tmp_path / "run", 2, *data_settings(data), settings=[]),
        "--set",
        'task.answer_field="solution"',
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        f"error: task.answer_field: {data} (split train) has no column 'solution'; "
        "columns: question, answer"
    ]
    assert not (tmp_path / "run").exists()
