"""The countdown verifier parses, never evaluates: unsafe input is refused, sound equations pass."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_stream.rewards.countdown import (
    ExpressionError,
    check_equation,
    countdown,
    evaluate,
)

REF = {"numbers": [3, 5, 7], "target": 22}


def _score(completion: str, **params: object) -> float:
    return countdown(completion, prompt="", reference=REF, **params)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "(1).real",
        "abs(3)",
        "9**9**9",
        "2 ** 100000",
        "3 and 5",
        "[3, 5]",
        "lambda: 0",
        "3;5",
        "1e308",
        "0x10",
        "",
    ],
)
def test_unsafe_or_foreign_syntax_is_refused(text: str) -> None:
    with pytest.raises(ExpressionError):
        evaluate(text)


def test_long_input_is_refused_before_parsing() -> None:
    with pytest.raises(ExpressionError, match="longer"):
        evaluate("1+" * 200 + "1")


def test_deep_nesting_is_refused() -> None:
    with pytest.raises(ExpressionError, match="nested"):
        evaluate("(" * 40 + "1" + ")" * 40)


def test_huge_literals_are_refused() -> None:
    with pytest.raises(ExpressionError, match="digits"):
        evaluate("1234567890")


def test_division_by_zero_is_refused() -> None:
    with pytest.raises(ExpressionError, match="zero"):
        evaluate("7/(5-5)")


def test_precedence_parentheses_and_unary_minus() -> None:
    assert evaluate("3 + 5 * 7")[0] == 38
    assert evaluate("(3 + 5) * 7")[0] == 56
    assert evaluate("-3 + 5")[0] == 2
    assert evaluate("7 / 2")[0] == Fraction(7, 2)
    assert evaluate("(3 + 5) * 7")[1] == [3, 5, 7]


@pytest.mark.parametrize("answer", ["3*5+7", "7 + 5 * 3", "(5*3)+7 = 22", " 3 * 5 + 7 "])
def test_correct_equations_score_one(answer: str) -> None:
    assert _score(f"<think>try</think><answer>{answer}</answer>") == 1.0


@pytest.mark.parametrize(
    "answer",
    [
        "3*5+8",  # 8 was not given
        "3*5+7+0",  # neither was 0
        "7*3+1",  # wrong value and an extra number
        "3*5+7 = 23",  # the right side is not the target
        "(3*5+7",  # unbalanced
        "5*5-3",  # 5 used twice
    ],
)
def test_wrong_equations_score_zero(answer: str) -> None:
    assert _score(f"<answer>{answer}</answer>") == 0.0


def test_last_answer_tag_counts() -> None:
    assert _score("<answer>1</answer> no, <answer>3*5+7</answer>") == 1.0


def test_missing_tag_scores_zero_unless_not_required() -> None:
    assert _score("3*5+7") == 0.0
    assert _score("3*5+7", require_tag=False) == 1.0


def test_use_all_requires_every_number() -> None:
    assert check_equation("3*7+1", [3, 7, 1, 9], 22)
    assert not check_equation("3*7+1", [3, 7, 1, 9], 22, use_all=True)


@given(st.lists(st.integers(1, 99), min_size=2, max_size=6))
def test_the_sum_of_the_given_numbers_is_always_accepted(numbers: list[int]) -> None:
    assert check_equation(" + ".join(map(str, numbers)), numbers, sum(numbers), use_all=True)


@given(st.text(max_size=80))
def test_arbitrary_text_never_raises(text: str) -> None:
    assert _score(f"<answer>{text}</answer>") in (0.0, 1.0)
