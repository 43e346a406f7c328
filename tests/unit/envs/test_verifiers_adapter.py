"""The verifiers adapter in process: a verifiers Env's run() coroutine answered turn by turn,
its task's @vf.reward / @vf.stop hooks and its recorded rewards give the episode's reward."""

from __future__ import annotations

import math
from typing import Any

import pytest

from grpo_stream.envs.base import Step
from grpo_stream.envs.verifiers_adapter import VerifiersEnv
from grpo_stream.tasks.verifiers import VerifiersTask


def started(spec: str, index: int = 0, **info: Any) -> tuple[VerifiersEnv, dict[str, Any]]:
    problem = VerifiersTask(spec).problem(index)
    reference = problem.reference
    reference["vf_task"].setdefault("info", {}).update(info)
    env = VerifiersEnv()
    env.reset(problem.prompt, reference)
    return env, reference


def test_each_env_turn_is_an_observation_and_the_end_carries_the_reward() -> None:
    env, _ = started("vf_guess:load_scripted")
    assert env.step("a") == Step("t1:", 0.0, False)
    assert env.step("b") == Step("t2:", 0.0, False)
    assert env.step("c") == Step("", 1.0, True)  # run() returned: record_reward("done", 1.0)


def test_reward_sums_the_tasks_reward_hook_and_what_run_records() -> None:
    env, ref = started("vf_guess:load_environment")
    target = ref["vf_task"]["info"]["target"]
    wrong = 1 if target != 1 else 2
    first = env.step(str(wrong))
    assert not first.done and first.observation.startswith(("higher", "lower"))
    last = env.step(str(target))
    assert last.done  # @vf.reward found = 1.0, record_reward("turns", -0.01 * 2)
    assert math.isclose(last.reward, 1.0 - 0.02)


def test_feedback_is_the_envs_own_text() -> None:
    env, ref = started("vf_guess:load_environment", index=3)
    target = ref["vf_task"]["info"]["target"]
    guess = 8 if target != 8 else 9
    expected = f"higher {guess + 1}-16:" if guess < target else f"lower 1-{guess - 1}:"
    assert env.step(str(guess)).observation == expected


def test_a_stop_hook_ends_the_exchange_as_verifiers_does() -> None:
    env, _ = started("vf_guess:load_scripted", stop_after=2)
    assert env.step("a") == Step("t1:", 0.0, False)
    # the @vf.stop fires before the third turn: that turn() comes back terminated
    assert env.step("b") == Step("", 0.5, True)


def test_single_agent_env_is_one_reply_scored_by_the_task() -> None:
    right, _ = started("vf_single:load_single", index=1)  # "2+1=" -> "3"
    assert right.step("3") == Step("", 1.0, True)
    wrong, _ = started("vf_single:load_single", index=1)
    assert wrong.step("4") == Step("", 0.0, True)


def test_an_env_that_raises_raises_from_step() -> None:
    env, _ = started("vf_guess:load_environment", index=0, raise_at=1)
    with pytest.raises(RuntimeError, match="vf env broke"):
        env.step("0")  # a wrong guess; run() raises before answering it


def test_episodes_are_independent_on_the_shared_loop() -> None:
    a, _ = started("vf_guess:load_scripted")
    b, _ = started("vf_guess:load_scripted")
    assert a.step("x") == Step("t1:", 0.0, False)
    assert b.step("x") == Step("t1:", 0.0, False)
    assert a.step("x") == Step("t2:", 0.0, False)
    assert b.step("x") == Step("t2:", 0.0, False)
