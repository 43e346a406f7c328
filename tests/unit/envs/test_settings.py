"""Episode settings: bad values fail with one line naming the setting."""

from __future__ import annotations

import pytest

from grpo_stream.config import ConfigError, load_config
from grpo_stream.envs.presets import task_preset


def test_the_default_run_has_no_environment() -> None:
    assert not load_config(None, []).env.enabled


def test_an_episode_run_on_vllm_is_a_valid_config() -> None:
    cfg = load_config(None, [*task_preset("guess"), 'generator.engine="vllm"'])
    assert cfg.env.enabled and cfg.generator.engine == "vllm"


def test_an_episode_run_on_vllm_refuses_inflight_updates() -> None:
    with pytest.raises(ConfigError, match=r"inflight_updates with generator\.engine = 'vllm'"):
        load_config(
            None,
            [*task_preset("guess"), 'generator.engine="vllm"', "generator.inflight_updates=true"],
        )


def test_a_vllm_block_size_off_the_16_grid_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"generator\.vllm_block_size \(40\)"):
        load_config(None, ['generator.engine="vllm"', "generator.vllm_block_size=40"])


def test_an_unknown_environment_name_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"env\.name"):
        load_config(None, ['env.name="nope"'])


def test_episodes_must_fit_the_trainer_micro_batch() -> None:
    with pytest.raises(ConfigError, match=r"env\.max_episode_tokens"):
        load_config(
            None,
            ['env.name="guess"', "env.max_episode_tokens=5000", "trainer.micro_batch_tokens=4096"],
        )


def test_the_guess_preset_is_a_valid_config_and_unknown_tasks_are_named() -> None:
    cfg = load_config(None, task_preset("guess"))
    assert cfg.env.name == "guess" and cfg.task.name == "guess"
    with pytest.raises(ValueError, match="--task 'chess'"):
        task_preset("chess")


def test_an_agent_run_is_an_episode_run_without_an_environment() -> None:
    cfg = load_config(None, task_preset("calc-tools"))
    assert cfg.env.enabled and cfg.env.name == "none"
    assert cfg.env.agent == "grpo_stream.agents.calc:calc_agent"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (['env.agent="no_colon"'], r"env\.agent 'no_colon': expected package\.module:function"),
        (['env.agent="a:b"', 'env.name="calc"'], r"env\.agent and env\.name = 'calc' exclude"),
        (['env.agent="a:b"', 'env.agent_client="requests"'], r"env\.agent_client"),
        (["env.agent_timeout_s=0"], r"env\.agent_timeout_s"),
        (["env.alarm_failed_share=1.5"], r"env\.alarm_failed_share"),
    ],
)
def test_bad_agent_settings_are_refused_naming_them(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
