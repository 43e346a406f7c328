"""Overlong shaping against its definitions: DAPO's soft overlong punishment (arXiv
2503.14476, Eq. 13) and TRL's mask_truncated_completions, through the hub's `assemble`."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpo_stream.algo.overlong import Overlong, soft_penalty
from grpo_stream.config import ConfigError, config_from_dict
from grpo_stream.config.algo import AdvantageSettings
from grpo_stream.hub.batches import assemble, build_batch
from grpo_stream.protocols import messages as m


def dapo_r_length(y: int, l_max: int, l_cache: int) -> float:
    """Eq. 13 of the DAPO paper, case by case as printed there."""
    if y <= l_max - l_cache:
        return 0.0
    if l_max - l_cache < y <= l_max:
        return ((l_max - l_cache) - y) / l_cache
    return -1.0


@pytest.mark.parametrize(("l_max", "l_cache"), [(16, 4), (8, 8), (20, 1), (512, 128)])
def test_soft_penalty_is_dapo_eq13_at_every_length(l_max: int, l_cache: int) -> None:
    lengths = list(range(0, l_max + 4))
    got = soft_penalty(lengths, l_max, l_cache)
    want = [dapo_r_length(y, l_max, l_cache) for y in lengths]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_soft_penalty_points_read_off_the_definition() -> None:
    # L_max 16, L_cache 4: free up to 12 tokens, -1/4 per token after, -1 at 16 and beyond
    assert list(soft_penalty([12, 13, 14, 16, 17], 16, 4)) == [0.0, -0.25, -0.5, -1.0, -1.0]


def test_soft_penalty_factor_scales_it() -> None:
    assert list(soft_penalty([13, 16], 16, 4, factor=0.5)) == [-0.125, -0.5]


def test_soft_penalty_refuses_a_buffer_past_max_tokens() -> None:
    with pytest.raises(ValueError, match="buffer 9"):
        soft_penalty([1], 8, 9)


def _rollout(lengths: list[int], truncated: list[bool], max_tokens: int) -> m.Rollout:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(offsets[-1])
    return m.Rollout(
        lease_id=1, group_id=3, instance="gen-0", policy_version=0,
        prompt_ids=np.array([1, 2], np.int32),
        completion_ids=np.arange(n, dtype=np.int32) % 7 + 4, completion_offsets=offsets,
        logprobs=np.full(n, -0.5, np.float32), texts=["x"] * len(lengths), truncated=truncated,
        gen_seconds=0.1,
        sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=max_tokens),
    )  # fmt: skip


def _scored(rewards: list[float]) -> m.Scored:
    return m.Scored(
        lease_id=1, group_id=3, rewards=np.array(rewards, np.float32), component_names=["r"],
        components=np.array([rewards], np.float32), errors=[],
    )  # fmt: skip


def grpo_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """(r - mean) / (sample std + eps) over the finite rewards; NaN ones get 0."""
    finite = [r for r in rewards if not math.isnan(r)]
    mean = sum(finite) / len(finite)
    std = math.sqrt(sum((r - mean) ** 2 for r in finite) / (len(finite) - 1))
    return [0.0 if math.isnan(r) else (r - mean) / (std + eps) for r in rewards]


def test_soft_shaping_enters_the_advantages_and_keeps_the_raw_rewards() -> None:
    lengths, rewards = [3, 7, 8, 8], [1.0, 1.0, 0.0, float("nan")]
    ro = _rollout(lengths, [False, False, True, True], max_tokens=8)
    got = assemble(ro, _scored(rewards), AdvantageSettings(), None, overlong=Overlong("soft", 4))
    shaped = [r + dapo_r_length(y, 8, 4) for r, y in zip(rewards, lengths, strict=True)]
    np.testing.assert_allclose(got.group.advantages, grpo_advantages(shaped), atol=1e-5)
    np.testing.assert_array_equal(got.group.rewards, np.array(rewards, np.float32))
    assert list(got.group.valid) == [True, True, True, False]


def test_soft_shaping_gives_signal_to_a_group_of_equal_rewards() -> None:
    ro = _rollout([2, 8], [False, True], max_tokens=8)
    plain = assemble(ro, _scored([1.0, 1.0]), AdvantageSettings(), None)
    shaping = Overlong("soft", 4)
    soft = assemble(ro, _scored([1.0, 1.0]), AdvantageSettings(), None, overlong=shaping)
    assert plain.zero_signal and not soft.zero_signal
    assert soft.group.advantages[0] > 0 > soft.group.advantages[1]


def test_mask_drops_truncated_completions_from_the_batch_only() -> None:
    lengths, rewards = [2, 8, 3, 8], [1.0, 0.0, 0.0, 1.0]
    truncated = [False, True, False, True]
    ro = _rollout(lengths, truncated, max_tokens=8)
    got = assemble(ro, _scored(rewards), AdvantageSettings(), None, overlong=Overlong("mask"))
    # advantages over all four (the truncated still count in mean and std)
    np.testing.assert_allclose(got.group.advantages, grpo_advantages(rewards), atol=1e-5)
    batch = build_batch(0, [got.group])
    assert len(batch.advantages) == 2  # sequences: completions 0 and 2
    np.testing.assert_allclose(batch.advantages, np.array(grpo_advantages(rewards))[[0, 2]], 1e-5)
    assert batch.totals.num_tokens == 2 + 3


def test_mask_with_every_completion_truncated_leaves_no_signal_not_a_failure() -> None:
    ro = _rollout([8, 8], [True, True], max_tokens=8)
    got = assemble(ro, _scored([1.0, 0.0]), AdvantageSettings(), None, overlong=Overlong("mask"))
    assert got.zero_signal and not got.failed


def _cfg(**algo: object) -> dict[str, object]:
    return {"algo": algo, "generator": {"max_tokens": 8}}


def test_config_refuses_a_buffer_longer_than_max_tokens() -> None:
    with pytest.raises(ConfigError, match=r"algo\.overlong_buffer"):
        config_from_dict(_cfg(overlong="soft", overlong_buffer=9))


def test_config_refuses_overlong_with_episodes() -> None:
    with pytest.raises(ConfigError, match=r"algo\.overlong applies to single-turn"):
        config_from_dict({"algo": {"overlong": "mask"}, "env": {"name": "guess"},
                          "task": {"name": "guess"}})  # fmt: skip


def test_config_takes_each_mode() -> None:
    for mode in ("none", "mask", "soft"):
        assert config_from_dict(_cfg(overlong=mode)).algo.overlong == mode
