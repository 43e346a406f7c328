"""The guess environment, hand-played."""

from __future__ import annotations

import math

from grpo_stream.envs.base import Step
from grpo_stream.envs.guess import GuessEnv, parse_number


def game(target: int, turns: int = 4) -> GuessEnv:
    env = GuessEnv(turns=turns, shaping=0.1)
    env.reset("guess 1-16:", {"target": target, "high": 16})
    return env


def test_feedback_narrows_the_range_and_a_find_ends_with_the_success_reward() -> None:
    env = game(11)
    assert env.step("8") == Step("higher 9-16:", 0.1, False)
    assert env.step("12") == Step("lower 9-11:", 0.1, False)
    found = env.step("11")
    assert found.done and math.isclose(found.reward, 1.1)


def test_a_guess_outside_the_allowed_range_gets_no_shaping() -> None:
    env = game(11)
    env.step("8")
    assert env.step("3") == Step("higher 9-16:", 0.0, False)


def test_not_finding_within_the_turn_limit_ends_without_success() -> None:
    env = game(16, turns=2)
    env.step("1")
    last = env.step("2")
    assert last.done and last.reward == 0.1


def test_a_reply_that_is_not_a_number_is_invalid_and_counts_as_a_turn() -> None:
    env = game(5, turns=1)
    assert env.step("abc") == Step("invalid 1-16:", 0.0, True)
    assert parse_number(" 7 ") == 7 and parse_number("²") is None and parse_number("") is None
