"""Edge cases of the built-in rewards: exact_match, format, length_penalty, math_verify."""

from __future__ import annotations

import pytest

from grpo_stream.rewards.builtin import (
    exact_match,
    format_reward,
    length_penalty,
    math_verify_reward,
)

ANS = {"answer": "19"}


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("19", 1.0),
        (" 19\n", 1.0),
        ("<think>12+7</think><answer> 19 </answer>", 1.0),
        ("<answer>18</answer> 19", 0.0),
        ("190", 0.0),
        ("", 0.0),
        ("1 9", 0.0),
    ],
)
def test_exact_match(completion: str, score: float) -> None:
    assert exact_match(completion, prompt="12+7=", reference=ANS) == score


def test_exact_match_reference_is_stripped_and_stringified() -> None:
    assert exact_match("7", prompt="", reference={"answer": 7}) == 1.0
    assert exact_match("7", prompt="", reference={"answer": " 7 "}) == 1.0


def test_exact_match_without_answer_in_reference_raises() -> None:
    with pytest.raises(ValueError, match="answer"):
        exact_match("7", prompt="", reference={"target": 7})


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("<think>a\nb</think><answer>3</answer>", 1.0),
        ("  <think></think>\n<answer></answer>\n", 1.0),
        ("<answer>3</answer>", 0.0),
        ("<think>a</think>", 0.0),
        ("<think>a</think><answer>3</answer> trailing", 0.0),
        ("<answer>3</answer><think>a</think>", 0.0),
        ("", 0.0),
    ],
)
def test_format(completion: str, score: float) -> None:
    assert format_reward(completion, prompt="", reference={}) == score


def test_format_tags_and_optional_think_are_params() -> None:
    done = "<reasoning>x</reasoning><final>3</final>"
    assert format_reward(done, prompt="", reference={}, think_tag="reasoning", answer_tag="final")
    assert format_reward("<answer>3</answer>", prompt="", reference={}, require_think=False)


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.0), (12, 0.0), (14, -0.5), (16, -1.0), (17, -1.0)],
)
def test_length_penalty_follows_dapo_soft_overlong(length: int, expected: float) -> None:
    value = length_penalty("x" * length, prompt="", reference={}, max_len=16, cache_len=4)
    assert value == pytest.approx(expected)


def test_length_penalty_counts_tokens_by_chars_per_token() -> None:
    value = length_penalty("x" * 56, prompt="", reference={}, max_len=16, cache_len=4,
                           chars_per_token=4.0)  # fmt: skip
    assert value == pytest.approx(-0.5)


def test_length_penalty_rejects_cache_longer_than_max() -> None:
    with pytest.raises(ValueError, match="cache_len"):
        length_penalty("x", prompt="", reference={}, max_len=4, cache_len=8)


@pytest.mark.parametrize(
    ("completion", "answer", "score"),
    [
        ("so the answer is \\boxed{72}", "72", 1.0),
        ("The result is $\\frac{1}{2}$", "0.5", 1.0),
        ("\\boxed{71}", "72", 0.0),
        ("I do not know", "72", 0.0),
        ("", "72", 0.0),
    ],
)
def test_math_verify(completion: str, answer: str, score: float) -> None:
    assert math_verify_reward(completion, prompt="", reference={"answer": answer}) == score


def test_math_verify_runs_outside_the_main_thread() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(math_verify_reward, "\\boxed{4}", prompt="", reference={"answer": "4"})
        assert future.result(timeout=60) == 1.0
