"""Every run config shipped in examples/ validates (cluster launch files are checked by plan)."""

from __future__ import annotations

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
    from grpo_stream.tasks.checks import check_data

    cfg = load_config(EXAMPLES / "reasoning-gym.toml")
    assert check_data(cfg) == []
