"""load_reward: built-ins and user import paths, params bound and checked at load time."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards import BUILTIN, RewardLoadError, combine, load_reward, reward_specs
from grpo_stream.tasks import TaskSettings, make_task


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_builtin_loads_by_name(name: str) -> None:
    params = {"max_len": 8, "cache_len": 2} if name == "length_penalty" else {}
    fn = load_reward(RewardSpec(name=name, params=params))
    assert callable(fn)


def test_params_are_bound() -> None:
    fn = load_reward(RewardSpec(name="length_penalty", params={"max_len": 4, "cache_len": 2}))
    assert fn("xxxxx", prompt="", reference={}) == -1.0


def test_unknown_param_fails_at_load_time() -> None:
    with pytest.raises(RewardLoadError, match="exact_match"):
        load_reward(RewardSpec(name="exact_match", params={"tag": "x"}))


def test_missing_required_param_fails_at_load_time() -> None:
    with pytest.raises(RewardLoadError, match="length_penalty"):
        load_reward(RewardSpec(name="length_penalty"))


def test_unknown_name_lists_the_builtins() -> None:
    with pytest.raises(RewardLoadError, match="built-ins are exact_match"):
        load_reward(RewardSpec(name="exactmatch"))


def test_module_that_does_not_import_is_a_clear_error() -> None:
    with pytest.raises(RewardLoadError, match=r"cannot import no_such_pkg\.rewards"):
        load_reward(RewardSpec(name="no_such_pkg.rewards:score"))


def test_missing_function_is_a_clear_error() -> None:
    with pytest.raises(RewardLoadError, match="has no 'nope'"):
        load_reward(RewardSpec(name="grpo_stream.rewards.builtin:nope"))


def test_non_callable_is_a_clear_error() -> None:
    with pytest.raises(RewardLoadError, match="not callable"):
        load_reward(RewardSpec(name="grpo_stream.rewards.countdown:MAX_CHARS"))


def test_function_with_the_wrong_signature_is_refused() -> None:
    with pytest.raises(RewardLoadError, match="math:sqrt"):
        load_reward(RewardSpec(name="math:sqrt"))


def test_user_reward_loads_from_an_import_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "registry_test_rewards.py").write_text(
        "def shorter(completion, *, prompt, reference, limit=3):\n"
        "    return 1.0 if len(completion) <= limit else 0.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_reward(RewardSpec(name="registry_test_rewards:shorter", params={"limit": 2}))
    assert fn("ab", prompt="", reference={}) == 1.0
    assert fn("abc", prompt="", reference={}) == 0.0


def test_reward_specs_prefer_the_config_then_the_task_defaults() -> None:
    task = make_task(TaskSettings())
    assert [s.name for s in reward_specs(TaskSettings(), task)] == ["exact_match"]
    custom = TaskSettings(rewards=[RewardSpec(name="format", weight=0.5)])
    assert reward_specs(custom, task) == [RewardSpec(name="format", weight=0.5)]


def test_combine_is_the_weighted_sum_and_keeps_nan() -> None:
    specs = [RewardSpec(name="countdown", weight=1.0), RewardSpec(name="format", weight=0.1)]
    assert combine([1.0, 1.0], specs) == pytest.approx(1.1)
    assert math.isnan(combine([math.nan, 1.0], specs))
