"""The distillation advantage against its definition: the per-token advantage is minus the
one-sample estimate of KL(pi_S || pi_T), mixed with the group advantage by the weight."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpo_stream.algo.distill import mean_reverse_kl, reverse_kl_advantages, token_advantages


def test_expected_token_advantage_under_the_student_is_minus_the_reverse_kl() -> None:
    # a 4-token vocabulary; KL(S || T) = sum_o S(o) log(S(o) / T(o)), from its definition
    student = [0.5, 0.25, 0.125, 0.125]
    teacher = [0.1, 0.2, 0.3, 0.4]
    kl = sum(s * math.log(s / t) for s, t in zip(student, teacher, strict=True))
    adv = reverse_kl_advantages(
        np.log(np.array(teacher, np.float32)), np.log(np.array(student, np.float32))
    )
    expected = sum(s * float(a) for s, a in zip(student, adv, strict=True))  # E_{o ~ S}[A(o)]
    assert expected == pytest.approx(-kl, abs=1e-6)


def test_a_student_equal_to_its_teacher_gets_no_advantage() -> None:
    lp = np.log(np.array([0.5, 0.3, 0.2], np.float32))
    assert np.all(reverse_kl_advantages(lp, lp) == 0.0)


def test_token_advantages_mix_the_group_advantage_and_the_teachers_by_the_weight() -> None:
    teacher = np.array([-0.1, -2.0, -0.5, -1.0, -0.2], np.float32)
    student = np.array([-0.3, -1.0, -0.5, -3.0, -0.2], np.float32)
    offsets = np.array([0, 2, 5], np.int64)  # completion 0: tokens 0-1, completion 1: 2-4
    group = np.array([0.8, -0.8], np.float32)
    valid = np.array([True, True])
    got = token_advantages(teacher, student, offsets, group, valid, weight=0.25)
    want = [
        0.75 * 0.8 + 0.25 * (-0.1 + 0.3),
        0.75 * 0.8 + 0.25 * (-2.0 + 1.0),
        0.75 * -0.8 + 0.25 * 0.0,
        0.75 * -0.8 + 0.25 * (-1.0 + 3.0),
        0.75 * -0.8 + 0.25 * 0.0,
    ]
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_weight_one_distils_alone_and_weight_zero_is_grpo() -> None:
    teacher = np.array([-0.1, -2.0], np.float32)
    student = np.array([-0.3, -1.0], np.float32)
    offsets, group, valid = np.array([0, 1, 2]), np.array([0.5, -0.5], np.float32), np.ones(2, bool)
    np.testing.assert_allclose(
        token_advantages(teacher, student, offsets, group, valid, 1.0), [0.2, -1.0], atol=1e-6
    )
    np.testing.assert_allclose(
        token_advantages(teacher, student, offsets, group, valid, 0.0), [0.5, -0.5], atol=1e-6
    )


def test_a_completion_without_a_reward_gets_no_token_advantage() -> None:
    teacher = np.array([-0.1, -2.0, -0.5], np.float32)
    student = np.array([-0.3, -1.0, -0.7], np.float32)
    got = token_advantages(
        teacher, student, np.array([0, 2, 3]), np.zeros(2, np.float32), np.array([False, True]), 1
    )
    np.testing.assert_allclose(got, [0.0, 0.0, 0.2], atol=1e-6)


def test_mean_reverse_kl_is_the_mean_per_token_estimate() -> None:
    teacher = np.array([-1.0, -2.0], np.float32)
    student = np.array([-0.5, -0.5], np.float32)
    assert mean_reverse_kl(teacher, student) == pytest.approx((0.5 + 1.5) / 2)
    assert mean_reverse_kl(np.zeros(0, np.float32), np.zeros(0, np.float32)) == 0.0


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="teacher log-probs"):
        reverse_kl_advantages(np.zeros(2, np.float32), np.zeros(3, np.float32))
