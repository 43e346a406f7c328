"""`up --resume`: the saved config is the run; only what does not change what is trained may
change (grpo_stream.config.resume)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from grpo_stream.config import ConfigError, load_config
from grpo_stream.config.loading import config_data
from grpo_stream.config.resume import load_run_config, resumed_config, without_derived

RUN = Path("runs/r")
STARTED = [
    'task.name="dataset"',
    'task.path="data/train.jsonl"',
    'task.rewards=[{name="python", import="mine:reward"}]',
    "trainer.lr=5e-5",
    "run.max_steps=300",
    "task.holdout=0.1",
]
"""How the saved run was started: its own data and reward, a learning rate, 300 steps."""


def _saved() -> dict[str, object]:
    """The run's config.toml as `up` wrote it (RunConfig.to_toml), read back."""
    return tomllib.loads(load_config(None, STARTED).to_toml())


def _resume(*sets: str) -> tuple[object, list[str]]:
    return resumed_config(_saved(), config_data(None, list(sets)), RUN)


def test_a_resume_with_no_settings_is_the_saved_run() -> None:
    cfg, changed = _resume()
    assert cfg == load_config(None, STARTED)
    assert changed == []


def test_a_resume_keeps_the_saved_max_steps_rather_than_the_default() -> None:
    cfg, _ = _resume()
    assert cfg.run.max_steps == 300  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "setting",
    [
        "run.max_steps=400",  # more steps
        "run.console_every=1",  # logging
        'run.sinks=["tensorboard"]',
        "run.log_completions=5",
        "eval.every=10",  # evaluation
        "generator.count=2",  # how many services, and where
        'hub.bind="tcp://0.0.0.0:5555"',
        "scorer.workers=2",
        "transport.heartbeat_timeout_s=30",
        "trainer.micro_batch_tokens=4096",  # the same update in less memory
        "trainer.checkpoint_every=5",
    ],
    ids=lambda s: s.split("=")[0],
)
def test_a_setting_that_does_not_change_what_is_trained_is_applied(setting: str) -> None:
    cfg, changed = _resume(setting)
    key, _ = setting.split("=", 1)
    assert changed == [key]
    assert cfg == load_config(None, [*STARTED, setting])


@pytest.mark.parametrize(
    "setting",
    [
        "task.name=arith",  # the task
        'task.path="data/other.jsonl"',  # the data
        'task.rewards=[{name="exact_match"}]',  # the rewards
        'model.name_or_path="Qwen/Qwen2.5-0.5B"',  # the model
        "trainer.lr=1e-4",  # the algorithm
        "algo.loss.eps_high=0.3",
        "generator.group_size=16",
        "hub.max_staleness=0",
        "run.seed=1",
    ],
    ids=lambda s: s.split("=")[0],
)
def test_a_setting_that_changes_what_is_trained_is_refused_in_one_line(setting: str) -> None:
    key = setting.split("=")[0]
    with pytest.raises(ConfigError) as err:
        _resume(setting)
    text = str(err.value)
    assert "\n" not in text
    assert f"{key} is " in text and "--run-dir NEW" in text
    assert 'model.name_or_path="runs/r/checkpoints/step-N"' in text


def test_a_setting_given_its_saved_value_is_no_change() -> None:
    cfg, changed = _resume("trainer.lr=5e-5", 'task.name="dataset"')
    assert changed == []
    assert cfg == load_config(None, STARTED)


def test_turning_episodes_off_on_resume_is_refused() -> None:
    started = ['task.name="guess"', 'env.name="guess"']
    saved = tomllib.loads(load_config(None, started).to_toml())
    with pytest.raises(ConfigError, match=r'env\.name is "guess" there'):
        resumed_config(saved, config_data(None, ['env.name="none"']), RUN)


def test_load_run_config_reads_the_run_directorys_saved_config(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.toml").write_text(load_config(None, STARTED).to_toml())
    cfg, _ = load_run_config(None, [f'run.run_dir="{run_dir}"'], resume=True)
    assert cfg.task.name == "dataset" and cfg.trainer.lr == 5e-5
    fresh, _ = load_run_config(None, [f'run.run_dir="{run_dir}"'], resume=False)
    assert fresh.task.name == "arith"  # a new run starts from the command line alone


def test_a_resume_of_a_directory_without_a_saved_config_takes_the_command_line(
    tmp_path: Path,
) -> None:
    cfg, changed = load_run_config(None, [f'run.run_dir="{tmp_path}"', "trainer.lr=1e-3"], True)
    assert cfg.trainer.lr == 1e-3 and changed == []


def test_an_unreadable_saved_config_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("[run\n")
    with pytest.raises(ConfigError, match=r"cannot read the run's config .*config\.toml"):
        load_run_config(None, [f'run.run_dir="{tmp_path}"'], resume=True)


def test_the_runs_own_secret_is_found_where_the_run_directory_is_now(tmp_path: Path) -> None:
    saved = load_config(None, ['run.run_dir="runs/r"', 'security.secret_file="runs/r/secret"'])
    base = without_derived(tomllib.loads(saved.to_toml()))
    cfg, _ = resumed_config(base, config_data(None, [f'run.run_dir="{tmp_path}"']), tmp_path)
    assert cfg.security.secret_file is None  # `up` derives RUN_DIR/secret again


def test_a_secret_file_the_user_named_is_kept() -> None:
    saved = load_config(None, ['run.run_dir="runs/r"', 'security.secret_file="keys/run.secret"'])
    base = without_derived(tomllib.loads(saved.to_toml()))
    cfg, _ = resumed_config(base, {}, RUN)
    assert str(cfg.security.secret_file) == "keys/run.secret"
