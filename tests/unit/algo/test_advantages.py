"""Group-relative advantages: hand-computed cases and numeric edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_stream.algo.advantages import (
    batch_std,
    batch_window,
    combine_rewards,
    compute_advantages,
    drops_group,
    filter_zero_signal,
    group_advantages,
    stream_batch_std,
)
from grpo_stream.config.algo import AdvantageSettings

NAN = math.nan
STD_1234 = math.sqrt(5 / 3)  # sample std of [1, 2, 3, 4]


def adv_of(rewards: list[float], **kw: object) -> list[float]:
    result = group_advantages(torch.tensor(rewards), AdvantageSettings.model_validate(kw))
    return result.advantages.tolist()


def test_group_scale_mean_baseline_matches_hand_computation() -> None:
    expected = [d / (STD_1234 + 1e-6) for d in (-1.5, -0.5, 0.5, 1.5)]
    assert adv_of([1, 2, 3, 4]) == pytest.approx(expected, rel=1e-6)


def test_scale_none_is_plain_mean_difference() -> None:
    assert adv_of([1, 2, 3, 4], scale="none") == pytest.approx([-1.5, -0.5, 0.5, 1.5])


def test_leave_one_out_baseline_subtracts_mean_of_others() -> None:
    # 1 - mean(2,3,4) = -2; 2 - mean(1,3,4) = -2/3; ...
    got = adv_of([1, 2, 3, 4], scale="none", baseline="leave_one_out")
    assert got == pytest.approx([-2.0, -2 / 3, 2 / 3, 2.0])


def test_leave_one_out_with_group_scale_divides_by_group_std() -> None:
    got = adv_of([1, 2, 3, 4], baseline="leave_one_out")
    expected = [d / (STD_1234 + 1e-6) for d in (-2.0, -2 / 3, 2 / 3, 2.0)]
    assert got == pytest.approx(expected, rel=1e-6)


def test_batch_scale_divides_group_deviation_by_batch_std() -> None:
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    result = compute_advantages(rewards, AdvantageSettings(scale="batch"))
    s = math.sqrt(2.0) + 1e-6  # sample std of [0, 1, 0, 3]
    expected = [[-0.5 / s, 0.5 / s], [-1.5 / s, 1.5 / s]]
    assert result.advantages.tolist()[0] == pytest.approx(expected[0], rel=1e-6)
    assert result.advantages.tolist()[1] == pytest.approx(expected[1], rel=1e-6)


def test_group_advantages_with_batch_scale_requires_batch_std() -> None:
    with pytest.raises(ValueError, match="batch_std"):
        group_advantages(torch.tensor([0.0, 1.0]), AdvantageSettings(scale="batch"))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("baseline", ["mean", "leave_one_out"])
def test_dense_batch_rows_equal_per_group_calls(scale: str, baseline: str) -> None:
    settings = AdvantageSettings.model_validate({"scale": scale, "baseline": baseline})
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(6, 5, generator=gen)
    rewards[1, 2] = NAN
    rewards[3] = 0.5
    dense = compute_advantages(rewards, settings)
    for i in range(rewards.shape[0]):
        one = group_advantages(rewards[i], settings, batch_std=batch_std(rewards))
        assert torch.equal(one.advantages, dense.advantages[i])
        assert one.zero_signal == bool(dense.zero_signal[i])


def test_nan_reward_is_excluded_from_mean_and_std_and_masked() -> None:
    result = group_advantages(torch.tensor([1.0, NAN, 3.0]), AdvantageSettings())
    s = math.sqrt(2.0) + 1e-6  # std of [1, 3]; mean 2
    assert result.advantages.tolist() == pytest.approx([-1 / s, 0.0, 1 / s], rel=1e-6)
    assert result.valid_mask.tolist() == [True, False, True]
    assert not result.zero_signal


def test_group_of_one_has_zero_advantage_and_no_signal() -> None:
    result = group_advantages(torch.tensor([5.0]), AdvantageSettings())
    assert result.advantages.tolist() == [0.0]
    assert result.zero_signal


def test_all_equal_rewards_give_exact_zero_and_no_signal() -> None:
    result = group_advantages(torch.tensor([0.1, 0.1, 0.1]), AdvantageSettings())
    assert result.advantages.tolist() == [0.0, 0.0, 0.0]
    assert result.zero_signal


def test_single_valid_reward_among_nans_carries_no_signal() -> None:
    result = group_advantages(torch.tensor([NAN, 2.0, NAN]), AdvantageSettings())
    assert result.zero_signal
    assert result.advantages.tolist() == [0.0, 0.0, 0.0]
    assert result.valid_mask.tolist() == [False, True, False]


def test_huge_rewards_give_the_same_advantages_as_unit_rewards() -> None:
    huge = adv_of([1e8, 2e8, 3e8, 4e8])
    assert all(math.isfinite(a) for a in huge)
    assert huge == pytest.approx(adv_of([1, 2, 3, 4]), rel=1e-5)


def test_tiny_rewards_stay_finite_and_ordered() -> None:
    tiny = adv_of([1e-8, 2e-8, 3e-8, 4e-8])
    expected = [d * 1e-8 / (STD_1234 * 1e-8 + 1e-6) for d in (-1.5, -0.5, 0.5, 1.5)]
    assert tiny == pytest.approx(expected, rel=1e-5)
    assert tiny == sorted(tiny)


def test_filter_drops_zero_signal_groups_and_counts_them() -> None:
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [2.0, 2.0]])
    out = filter_zero_signal(compute_advantages(rewards, AdvantageSettings()), AdvantageSettings())
    assert out.dropped == 2
    assert out.kept.tolist() == [1]
    assert out.result.advantages.shape == (1, 2)


def test_filter_disabled_keeps_every_group() -> None:
    settings = AdvantageSettings(filter_zero_signal=False)
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    out = filter_zero_signal(compute_advantages(rewards, settings), settings)
    assert out.dropped == 0
    assert out.kept.tolist() == [0, 1]


def test_drops_group_follows_the_filter_setting() -> None:
    flat = group_advantages(torch.tensor([1.0, 1.0]), AdvantageSettings())
    assert drops_group(flat, AdvantageSettings())
    assert not drops_group(flat, AdvantageSettings(filter_zero_signal=False))


def test_combine_rewards_is_weighted_sum_and_propagates_nan() -> None:
    components = torch.tensor([[1.0, 0.0, 1.0], [0.5, 0.5, NAN]])
    total = combine_rewards(components, [1.0, 2.0])
    assert total[:2].tolist() == [2.0, 1.0]
    assert math.isnan(total[2].item())


def test_combine_rewards_keeps_nan_even_with_zero_weight() -> None:
    total = combine_rewards(torch.tensor([[1.0], [NAN]]), [1.0, 0.0])
    assert math.isnan(total[0].item())


def test_combine_rewards_rejects_wrong_number_of_weights() -> None:
    with pytest.raises(ValueError, match="2 weights for 3"):
        combine_rewards(torch.zeros(3, 4), [1.0, 1.0])


def test_stream_batch_std_over_one_batch_window_is_that_batchs_std() -> None:
    from collections import deque

    previous = torch.tensor([[5.0, -5.0, 9.0, 0.0]])
    batch = torch.tensor([[0.0, 1.0, 4.0, 2.0], [0.0, 3.0, 7.0, 1.0]])
    recent: deque[float] = deque(maxlen=batch_window(groups_per_step=2, group_size=4))
    for row in (*previous, *batch):  # the hub's grouper feeds it group by group
        recent.extend(float(r) for r in row)
    assert stream_batch_std(recent) == pytest.approx(batch_std(batch))


def test_stream_batch_std_skips_nan_and_is_one_before_two_rewards() -> None:
    assert stream_batch_std([0.5, NAN]) == 1.0
    assert stream_batch_std([0.0, NAN, 2.0]) == pytest.approx(math.sqrt(2.0))
