"""Per-turn discounted returns and advantages, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpo_stream.algo.returns import discounted_returns, per_turn_advantages, token_advantages
from grpo_stream.config.algo import AdvantageSettings

NO_SCALE = AdvantageSettings(scale="none")


def test_return_to_go_is_the_discounted_sum_of_later_rewards() -> None:
    # G_3 = 4; G_2 = 0 + 0.5 * 4 = 2; G_1 = 1 + 0.5 * 2 = 2
    assert discounted_returns([1.0, 0.0, 4.0], 0.5).tolist() == [2.0, 2.0, 4.0]
    assert discounted_returns([1.0, 2.0], 1.0).tolist() == [3.0, 2.0]
    assert discounted_returns([], 0.9).tolist() == []


def test_baseline_is_the_mean_at_equal_turn_index() -> None:
    # gamma = 1: episode a returns [3, 2], episode b returns [1, 1]
    # b_1 = (3 + 1) / 2 = 2, b_2 = (2 + 1) / 2 = 1.5
    got = per_turn_advantages([[1.0, 2.0], [0.0, 1.0]], [True, True], 1.0, NO_SCALE)
    assert got.advantages[0].tolist() == [1.0, 0.5]
    assert got.advantages[1].tolist() == [-1.0, -0.5]
    assert not got.zero_signal


def test_a_turn_index_one_episode_reached_uses_the_group_mean() -> None:
    # returns: a = [1, 1] (gamma 1: [0 + 1, 1]), b = [3]
    # b_1 = (1 + 3) / 2 = 2; turn 2 only in a: group mean of all returns (1 + 1 + 3) / 3
    got = per_turn_advantages([[0.0, 1.0], [3.0]], [True, True], 1.0, NO_SCALE)
    assert got.advantages[0].tolist() == pytest.approx([-1.0, 1.0 - 5.0 / 3.0])
    assert got.advantages[1].tolist() == [1.0]


def test_group_scale_divides_by_the_pooled_sample_std() -> None:
    settings = AdvantageSettings(scale="group", eps=1e-9)
    got = per_turn_advantages([[1.0, 2.0], [0.0, 1.0]], [True, True], 1.0, settings)
    std = float(np.std([3.0, 2.0, 1.0, 1.0], ddof=1))  # returns of both episodes
    assert got.advantages[0].tolist() == pytest.approx([1.0 / std, 0.5 / std])


def test_a_failed_episode_gets_zeros_and_no_part_in_the_baseline() -> None:
    got = per_turn_advantages([[1.0], [0.0], [math.nan, 5.0]], [True, True, False], 0.9, NO_SCALE)
    assert got.advantages[0].tolist() == [0.5] and got.advantages[1].tolist() == [-0.5]
    assert got.advantages[2].tolist() == [0.0, 0.0]


def test_equal_returns_carry_no_signal() -> None:
    got = per_turn_advantages([[1.0], [1.0]], [True, True], 1.0, NO_SCALE)
    assert got.zero_signal and all(a.tolist() == [0.0] for a in got.advantages)


def test_each_sampled_token_carries_its_turns_advantage_env_tokens_zero() -> None:
    # turn 0: tokens 0-1 sampled, 2-3 environment; turn 1: tokens 4-5 sampled
    out = token_advantages(np.array([0.5, -1.0]), [0, 4], [1, 1, 0, 0, 1, 1])
    assert out.tolist() == [0.5, 0.5, 0.0, 0.0, -1.0, -1.0]
