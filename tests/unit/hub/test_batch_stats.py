"""Step metrics computed by the hub: rewards include filtered groups; NaN rewards are skipped."""

from __future__ import annotations

import math

import numpy as np

from grpo_stream.hub.batches import reward_stats
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.messages import SamplingParams


def _group(rewards: list[float]) -> Group:
    g = len(rewards)
    return Group(
        group_id=0,
        policy_version=0,
        prompt_ids=np.zeros(1, np.int32),
        completion_ids=np.zeros(g, np.int32),
        completion_offsets=np.arange(g + 1, dtype=np.int64),
        logprobs=np.zeros(g, np.float32),
        rewards=np.array(rewards, np.float32),
        advantages=np.zeros(g, np.float32),
        valid=~np.isnan(np.array(rewards)),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
    )


def test_reward_counts_filtered_groups_and_skips_nan() -> None:
    mean, _, pass_rate = reward_stats([_group([1.0, 0.0, float("nan")])], [1.0, 1.0])
    assert mean == 0.75 and pass_rate == 0.75


def test_no_rewards_give_nan_not_zero() -> None:
    assert all(math.isnan(x) for x in reward_stats([], []))
