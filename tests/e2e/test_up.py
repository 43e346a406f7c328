"""`grpo-stream up` end to end: real processes, real sockets, the real tiny model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from grpo_stream.training.metrics import REQUIRED, read_metrics
from grpo_stream.training.samples import read_samples

from .conftest import SMALL, changed_parameters, up_command

STEPS = 4


def run_up(run_dir: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """`up` with small steps at the default heartbeat deadlines, a checkpoint every 2 steps."""
    settings = [*SMALL, "--set", "trainer.checkpoint_every=2", "--set", "run.log_completions=2"]
    cmd = up_command(run_dir, STEPS, *extra, settings=settings)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("up") / "run"
    result = run_up(run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_metrics_have_every_field_for_every_step(finished_run: Path) -> None:
    rows = read_metrics(finished_run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        assert set(REQUIRED) <= set(row)
    assert rows[-1]["policy_version"] == STEPS


def test_parameters_changed_and_checkpoint_loads_with_transformers(finished_run: Path) -> None:
    ckpt = finished_run / "checkpoints" / f"step-{STEPS}"
    assert (ckpt / "COMPLETE").exists()
    assert changed_parameters(ckpt, "grpo-stream/tiny-arith")


def test_accounting_invariant_holds(finished_run: Path) -> None:
    counters = json.loads((finished_run / "hub" / "counters.json").read_text())
    done = sum(counters[k] for k in ("trained", "filtered", "stale", "failed"))
    assert counters["dispatched"] == done + counters["in_progress"]
    assert counters["trained"] == 4 * STEPS


def test_run_directory_contract(finished_run: Path) -> None:
    assert (finished_run / "config.toml").exists()
    assert (finished_run / "report.png").stat().st_size > 0
    logs = {p.name for p in (finished_run / "logs").glob("*.jsonl")}
    assert {
        "grouper-grouper-0.jsonl",
        "trainer-trainer-0.jsonl",
        "generator-generator-0.jsonl",
        "scorer-scorer-0.jsonl",
    } <= logs


def test_sample_completions_are_logged_every_n_steps(finished_run: Path) -> None:
    samples = read_samples(finished_run)
    assert {s["step"] for s in samples} == {2, 4}
    for step in (2, 4):
        rows = [s for s in samples if s["step"] == step]
        prompts = sorted({s["prompt"] for s in rows})
        assert 1 <= len(prompts) <= 2  # run.log_completions_prompts
        for prompt in prompts:
            group = [s for s in rows if s["prompt"] == prompt]
            # arith's reward is exact match; GRPO's advantages of a group are centred
            assert all(s["reward"] in (0.0, 1.0) and s["tokens"] >= 1 for s in group)
            assert abs(sum(s["advantage"] for s in group)) < 1e-3


def test_up_refuses_an_existing_run_without_resume(finished_run: Path) -> None:
    result = run_up(finished_run, timeout=60)
    assert result.returncode != 0 and "--resume" in result.stderr


def test_resume_continues_versions(finished_run: Path) -> None:
    result = run_up(finished_run, "--resume", "--max-steps", str(STEPS + 2))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(finished_run)
    assert rows[-1]["step"] == STEPS + 2 and rows[-1]["policy_version"] == STEPS + 2


def test_bad_config_value_exits_with_one_line(tmp_path: Path) -> None:
    result = run_up(tmp_path / "r", "--set", "generator.group_size=0", timeout=60)
    assert result.returncode != 0
    assert "generator.group_size" in result.stderr


def test_each_checkpoint_is_saved_once(finished_run: Path) -> None:
    events = [
        json.loads(line)
        for line in (finished_run / "logs" / "trainer-trainer-0.jsonl").read_text().splitlines()
    ]
    saved = [e["step"] for e in events if e["event"] == "checkpoint.saved"]
    assert STEPS in saved and saved == sorted(set(saved))  # the last step too, once each
