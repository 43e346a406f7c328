"""`grpo-stream eval` on the shipped tiny model, and the pass@k estimator it prints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from grpo_stream.cli.main import app
from grpo_stream.config.tasks import RewardSpec
from grpo_stream.evaluation import Sample, Tally, pass_at_k, score_group
from grpo_stream.rewards import load_reward
from grpo_stream.tasks import Problem


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _eval(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(app, ["eval", "--json", *args])
    assert result.exit_code == 0, result.output
    out: dict[str, object] = json.loads(result.stdout)
    return out


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 0, 1, 0.0),
        (10, 3, 1, 0.3),
        (10, 10, 5, 1.0),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (8, 1, 8, 1.0),
        (8, 0, 8, 0.0),
        (10, 2, 3, 1 - 56 / 120),  # 1 - C(8,3)/C(10,3)
        (4, 3, 2, 1.0),  # n - c < k: every pair holds a correct sample
    ],
)
def test_pass_at_k_hand_checked_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_is_stable_for_large_n() -> None:
    value = pass_at_k(2000, 10, 100)
    exact = 1 - math.comb(1990, 100) / math.comb(2000, 100)
    assert value == pytest.approx(exact, rel=1e-9)


def test_pass_at_k_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_a_reward_that_raises_scores_zero_and_is_counted() -> None:
    specs = [RewardSpec(name="exact_match"), RewardSpec(name="countdown")]
    tally = Tally(specs=specs)
    fns = [load_reward(s) for s in specs]
    problem = Problem(index=0, prompt="1+1=", reference={"answer": "2"})
    score_group(fns, tally, problem, [Sample("2", False), Sample("<answer>3</answer>", False)])
    assert tally.errors == 1  # countdown read reference["numbers"] for the tagged completion
    assert tally.correct == [1]
    assert tally.totals == [1.0, 0.0]


def test_a_reward_that_returns_nan_is_counted_as_an_error() -> None:
    specs = [RewardSpec(name="exact_match"), RewardSpec(name="format")]
    tally = Tally(specs=specs)
    fns = [load_reward(specs[0]), lambda completion, **_: math.nan]
    score_group(
        fns, tally, Problem(index=0, prompt="", reference={"answer": "2"}), [Sample("2", False)]
    )
    assert tally.errors == 1
    assert tally.totals == [1.0]


def test_eval_json_on_tiny_model_lands_in_the_band() -> None:
    out = _eval("--n", "48", "--samples", "8", "--seed", "0")
    assert out["model"] == "grpo-stream/tiny-arith"
    assert out["problems"] == 48 and out["samples"] == 8
    assert 0.15 <= float(out["pass_at_1"]) <= 0.5  # type: ignore[arg-type]
    assert float(out["pass_at_k"]) >= float(out["pass_at_1"])  # type: ignore[arg-type]
    assert out["mean_reward"] == pytest.approx(out["pass_at_1"])
    assert out["reward_errors"] == 0


def test_eval_is_reproducible_with_a_seed() -> None:
    assert _eval("--n", "8", "--samples", "4", "--seed", "3") == _eval(
        "--n", "8", "--samples", "4", "--seed", "3"
    )


def test_eval_prints_a_table_without_json() -> None:
    result = CliRunner().invoke(app, ["eval", "--n", "4", "--samples", "2"])
    assert result.exit_code == 0, result.output
    assert "pass@1" in result.stdout and "pass@2" in result.stdout


def test_eval_with_one_token_truncates_every_sample() -> None:
    out = _eval("--n", "4", "--samples", "2", "--max-tokens", "1")
    assert out["truncated"] == 8
    assert out["pass_at_1"] == 0.0


def test_eval_of_a_missing_model_fails_with_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval", "--model", str(tmp_path / "absent"), "--n", "1"])
    assert result.exit_code != 0
    assert "error:" in result.output


def test_eval_of_an_unknown_task_is_a_config_error() -> None:
    result = CliRunner().invoke(app, ["eval", "--task", "chess"])
    assert result.exit_code == 2
    assert "task.name" in result.output


def test_a_missing_checkpoint_is_one_line_naming_the_option(tmp_path):
    missing = tmp_path / "checkpoints" / "step-200"
    result = CliRunner().invoke(app, ["eval", "--model", str(missing)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: --model: {missing} does not exist"
