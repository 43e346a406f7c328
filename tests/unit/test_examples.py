"""Every run config shipped in examples/ validates (cluster launch files are checked by plan)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from grpo_stream.config import load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN_CONFIGS = sorted(
    p.name for p in EXAMPLES.glob("*.toml") if "hosts" not in tomllib.loads(p.read_text())
)


def test_there_are_run_configs_to_check() -> None:
    assert {"qwen-gsm8k.toml", "gsm8k-parquet.toml", "reasoning-gym.toml"} <= set(RUN_CONFIGS)


@pytest.mark.parametrize("name", RUN_CONFIGS)
def test_example_run_config_validates(name: str) -> None:
    load_config(EXAMPLES / name)


def test_reasoning_gym_example_builds_its_task_and_eval_set() -> None:
    from grpo_stream.preflight.data import check_data

    cfg = load_config(EXAMPLES / "reasoning-gym.toml")
    assert check_data(cfg) == []


@pytest.fixture
def own_rewards_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `PYTHONPATH=examples/own` does for the run (docs/guide/your-own.md); a
    my_rewards another test imported earlier is not the example's."""
    monkeypatch.syspath_prepend(str(EXAMPLES / "own"))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)


@pytest.mark.usefixtures("own_rewards_importable")
def test_own_example_reads_its_file_and_loads_its_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_stream.preflight.data import check_data
    from grpo_stream.tasks import make_task

    monkeypatch.chdir(EXAMPLES.parent)  # task.dataset is relative to where `up` starts
    cfg = load_config(EXAMPLES / "own.toml")
    assert check_data(cfg) == ["a", "b", "sum"]
    problem = make_task(cfg.task).problem(0)
    a, b = (int(x) for x in problem.prompt.rstrip("=").split("+"))
    assert problem.reference == {"answer": str(a + b)}


@pytest.mark.usefixtures("own_rewards_importable")
def test_own_examples_reward_scores_by_distance_to_the_answer() -> None:
    from grpo_stream.rewards import load_reward

    cfg = load_config(EXAMPLES / "own.toml")
    assert cfg.task.rewards is not None
    near = load_reward(cfg.task.rewards[0])  # tolerance = 1 from the config
    ref = {"answer": "14"}
    scores = [near(c, prompt="10+4=", reference=ref) for c in ("14", "15", "16", "17", "x")]
    assert scores == [1.0, 1.0, 0.5, 0.0, 0.0]


def test_own_example_without_its_path_fails_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_stream.preflight.data import DataCheckError, check_data

    monkeypatch.chdir(EXAMPLES.parent)
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    cfg = load_config(EXAMPLES / "own.toml")
    with pytest.raises(DataCheckError, match="cannot import my_rewards: No module named"):
        check_data(cfg)
