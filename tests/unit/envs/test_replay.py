"""A scorer's replay of a group's episodes: each action gets the environment's own answer,
a failing environment fails only its episode, and nothing after `done` is played."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.local import LocalEnvs
from grpo_stream.envs.registry import env_factory, generator_rewards, replayable
from grpo_stream.envs.replay import replay
from grpo_stream.protocols.episodes import EpisodeScoreRequest

GUESS = EnvSettings(name="guess", guess_turns=4, guess_shaping=0.1)


def request(actions: list[list[str]], target: int = 11) -> EpisodeScoreRequest:
    counts = np.cumsum([0, *[len(a) for a in actions]])
    return EpisodeScoreRequest(
        lease_id=1,
        group_id=7,
        prompt="guess 1-16:",
        reference={"target": target, "high": 16},
        actions=[a for episode in actions for a in episode],
        action_offsets=counts.astype(np.int64),
    )


def test_each_action_gets_the_guess_environments_answer() -> None:
    # the rules (envs/guess.py): 0.1 for a guess inside the range the feedback allows, 1 more
    # for the hidden number; the answer narrows the range
    got = replay(LocalEnvs(env_factory(GUESS)), request([["8", "12", "10", "11"], ["3", "9"]]))
    assert got.rewards.tolist() == pytest.approx([0.1, 0.1, 0.1, 1.1, 0.1, 0.1])
    first = ["higher 9-16:", "lower 9-11:", "higher 11-11:", ""]
    assert got.observations == [*first, "higher 4-16:", "higher 10-16:"]
    assert got.done == [False, False, False, True, False, False]
    assert got.errors == ["", ""]


def test_a_failing_environment_fails_only_its_episode(make_pool) -> None:
    pool = make_pool("bad_envs:Raises")  # raises at its second step
    got = replay(pool, request([["1", "2", "3"], ["1"]]))
    assert "bad env" in got.errors[0] and got.errors[1] == ""
    assert got.rewards[0] == pytest.approx(0.25) and math.isnan(got.rewards[1])
    assert math.isnan(got.rewards[2]) and got.rewards[3] == pytest.approx(0.25)


def test_actions_after_the_environment_said_done_are_not_played() -> None:
    got = replay(LocalEnvs(env_factory(GUESS)), request([["11", "5"]]))
    assert got.done == [True, False] and got.rewards[0] == pytest.approx(1.1)
    assert math.isnan(got.rewards[1])


def test_built_in_environments_are_replayable_and_an_agent_is_not() -> None:
    assert replayable(GUESS) and replayable(EnvSettings(name="calc"))
    agent = EnvSettings(agent="grpo_stream.agents.calc:calc_agent")
    assert not replayable(agent) and generator_rewards(agent)
    assert not generator_rewards(GUESS) and not generator_rewards(EnvSettings())


def test_a_user_environment_without_the_declaration_trusts_its_generator() -> None:
    assert not replayable(EnvSettings(name="bad_envs:Raises"))
