"""math_verify's fast path gives the plain library call's verdict on every case tried: a
corpus of the shapes it decides and their near misses (short numbers, fractions, negatives,
thousands separators, boxed, GSM8K-style reasoning, LaTeX, wrong answers, empty completions),
a generated corpus, and random texts."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_stream.rewards.builtin import math_verify_reward
from grpo_stream.rewards.mathfast import fast_verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: bench/
from bench.rewards import before as library  # the plain library call, per completion

PARAGRAPH = (
    "Natalia sold 48 clips in April. In May she sold half as many: 48 / 2 = 24 clips. "
    "Altogether she sold 48 + 24 = 72 clips."
)
DECIDED = [  # (completion, gold): shapes the fast path must decide, right and wrong
    ("72", "72"),
    ("71", "72"),
    (" 72\n", "72"),
    ("72.", "72"),
    ("-5", "-5"),
    ("-5", "5"),
    ("5", "-5"),
    ("0", "0"),
    ("-0", "0"),
    ("0", "-0"),
    ("1000", "1000"),
    ("123456789012345678901234567890", "123456789012345678901234567890"),
    ("123456789012345678901234567891", "123456789012345678901234567890"),
    ("0.5", "0.5"),
    ("-2.25", "-2.25"),
    (f"{PARAGRAPH} #### 72", "72"),
    (f"{PARAGRAPH} #### 71", "72"),
    (f"{PARAGRAPH} So the total is 72.", "72"),
    (f"{PARAGRAPH}\nTotal = 72", "72"),
    (f"{PARAGRAPH}\nTotal =72", "72"),
    (f"{PARAGRAPH}\nTotal: 70", "72"),
    (f"{PARAGRAPH} The answer is 72.", "72"),
    (f"{PARAGRAPH} The answer is 27.", "72"),
    (f"{PARAGRAPH} Answer is -72", "-72"),
    ("answer is 5", "5"),
    (f"{PARAGRAPH} The answer is \\boxed{{72}}.", "72"),
    ("\\boxed{72}", "72"),
    ("\\boxed{71}", "72"),
    ("\\boxed{-5}", "-5"),
    ("\\boxed{-5}", "5"),
    (f"{PARAGRAPH} So \\boxed{{72}}", "72"),
    ("x=5", "5"),
    ("costs € 5", "5"),
    ("She has 3 apples and 4 pears, 7", "7"),
]
DEFERRED = [  # (completion, gold): near misses the parser must decide
    ("", "72"),
    ("   ", "72"),
    ("no number here", "72"),
    ("1/2", "0.5"),
    ("0.5", "1/2"),
    ("$\\frac{1}{2}$", "1/2"),
    ("\\frac{1}{2}", "0.5"),
    ("1,000", "1000"),
    ("1 000", "1000"),
    ("1,2345", "1234"),
    ("007", "7"),
    ("-007", "-7"),
    ("72%", "72"),
    ("$72", "72"),
    ("€72", "72"),
    ("3 - 72", "-69"),
    ("3 - 72", "72"),
    ("50 + 22", "72"),
    ("3 * 24.", "24"),
    ("The answer: 72", "72"),
    ("The final answer is 72", "72"),
    ("answer is 72 = 70", "70"),
    ("The answer is 5. Check: the answer is 5.", "5"),
    ("The answer is 72.5", "72"),
    ("\\boxed{72} and \\boxed{5}", "5"),
    ("$\\boxed{72}$", "72"),
    ("\\boxed{72}%", "72"),
    ("\\boxed{ 72 }", "72"),
    ("\\boxed{072}", "72"),
    ("\\(72\\)", "72"),
    ("see [1] 72", "72"),
    ("**72**", "72"),
    ("72.5", "72"),
    ("0,5", "0.5"),
    ("٧ 500", "500"),
    ("1٧ 500", "500"),
    ("٧٢", "72"),
    ("x 72", "0072"),
    ("72", "+72"),
    ("72", "7.20"),
    ("--5", "5"),
    ("5--5", "5"),
    (f"{PARAGRAPH}", "24"),
    (f"{PARAGRAPH} The answer is 72 apples.", "72"),
]


def _generated(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """GSM8K-style and short-answer completions around random integer answers."""
    rng = random.Random(seed)
    shapes = [
        "{n}",
        " {n} ",
        "{n}.",
        "The answer is {n}.",
        "#### {n}",
        "\\boxed{{{n}}}",
        "So she pays {a} + {b} = {n}.",
        "{a} x {b} = {n}",
        "She earns ${n}.",
        "{a} - {n}",
        "Total: {n}",
        "The final answer is {n}",
        "answer: {n}",
        "{n} apples",
        "{n}%",
        "$\\boxed{{{n}}}$",
        "{a},{n}",
        "It costs {a} dollars, so {n}",
        "{a}/{n}",
    ]
    cases = []
    for _ in range(count):
        gold = rng.randint(-2000, 2000)
        shown = gold if rng.random() < 0.5 else gold + rng.choice([-10, -1, 1, 7, 1000])
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        body = rng.choice(shapes).format(n=shown, a=a, b=b)
        lead = rng.choice(["", f"{PARAGRAPH} ", "Let me think.\n", f"{a} and {b}. "])
        cases.append((lead + body, str(gold)))
    return cases


@pytest.mark.parametrize(("completion", "gold"), DECIDED)
def test_the_fast_path_decides_plain_answers_as_math_verify_does(completion: str, gold: str):
    assert fast_verdict(completion, gold) == library(completion, gold)


@pytest.mark.parametrize(("completion", "gold"), DEFERRED)
def test_the_fast_path_leaves_near_misses_to_the_parser(completion: str, gold: str):
    assert fast_verdict(completion, gold) is None


def test_the_reward_equals_the_library_call_on_a_generated_corpus():
    corpus = DECIDED + DEFERRED + _generated(600)
    reward = {(c, g): math_verify_reward(c, prompt="", reference={"answer": g}) for c, g in corpus}
    differ = [(c, g) for c, g in corpus if reward[c, g] != library(c, g)]
    decided = sum(fast_verdict(c, g) is not None for c, g in corpus)
    assert differ == []
    assert decided > len(corpus) / 3  # the generated shapes are mostly plain answers


PIECES = st.sampled_from(
    [
        "7",
        "72",
        "-",
        "0",
        " ",
        "\n",
        "=",
        "+",
        ".",
        ",",
        "x",
        "answer is ",
        "Answer",
        "final answer",
        "\\boxed{",
        "}",
        "$",
        "[",
        "%",
        "٧",
        "(",
        ")",
        "/",
        "**",
    ]
)
TAILS = st.sampled_from(
    [
        "",
        " 7",
        " 72",
        "=7",
        " -7.",
        "\n72 ",
        " answer is 7",
        " answer is -72.",
        "\\boxed{7}",
        "\\boxed{72}.",
        " 772",
    ]
)
TEXT = st.tuples(st.lists(PIECES, max_size=10).map("".join), TAILS).map("".join)
"""Random pieces, often before the tail of a shape the fast path decides."""


@settings(max_examples=400, deadline=None, derandomize=True)
@given(completion=TEXT, gold=st.sampled_from(["7", "72", "-7", "0", "772", "7.2"]))
def test_a_fast_verdict_on_random_text_is_the_library_verdict(completion: str, gold: str):
    fast = fast_verdict(completion, gold)
    if fast is not None:
        assert fast == library(completion, gold), (completion, gold)


def test_a_kept_reference_parse_never_answers_for_another_reference():
    half = "The answer is $\\frac{1}{2}$"
    golds = ["1/2", "1/3", "0.5", "2"]
    scores = [math_verify_reward(half, prompt="", reference={"answer": g}) for g in golds]
    assert scores == [1.0, 0.0, 1.0, 0.0]
