"""The built-in reward functions: exact_match, math_verify, format, length_penalty.

Every reward has the signature `fn(completion, *, prompt, reference, **params) -> float`, is
pure (same inputs, same score) and never evaluates the completion as code. A reference that
lacks what the reward needs is a configuration error: it raises, and the scorer counts it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from grpo_stream.rewards.mathfast import fast_verdict
from grpo_stream.rewards.text import tagged


def _answer(reference: dict[str, Any]) -> str:
    if "answer" not in reference:
        raise ValueError("this reward needs reference['answer']; the task provides none")
    return str(reference["answer"]).strip()


def exact_match(
    completion: str, *, prompt: str, reference: dict[str, Any], answer_tag: str = "answer"
) -> float:
    """1.0 when the completion (or the content of its last <answer> tag) equals the answer.

    Both sides are compared after stripping surrounding whitespace.
    """
    found = tagged(completion, answer_tag)
    text = completion if found is None else found
    return float(text.strip() == _answer(reference))


@lru_cache(maxsize=16)
def _format_pattern(think_tag: str, answer_tag: str, require_think: bool) -> re.Pattern[str]:
    think, answer = re.escape(think_tag), re.escape(answer_tag)
    head = rf"<{think}>.*?</{think}>\s*" if require_think else rf"(?:<{think}>.*?</{think}>\s*)?"
    return re.compile(rf"\s*{head}<{answer}>.*?</{answer}>\s*", re.DOTALL)


def format_reward(
    completion: str,
    *,
    prompt: str,
    reference: dict[str, Any],
    think_tag: str = "think",
    answer_tag: str = "answer",
    require_think: bool = True,
) -> float:
    """1.0 when the whole completion is `<think>...</think><answer>...</answer>`, else 0.0."""
    pattern = _format_pattern(think_tag, answer_tag, require_think)
    return float(pattern.fullmatch(completion) is not None)


def length_penalty(
    completion: str,
    *,
    prompt: str,
    reference: dict[str, Any],
    max_len: int,
    cache_len: int,
    chars_per_token: float = 1.0,
) -> float:
    """DAPO's overlong soft penalty: 0 up to max_len - cache_len, then linear down to -1.

    Length is in characters / chars_per_token (reward functions see text, not token ids);
    for the character-level tiny model the default 1.0 counts tokens exactly.
    """
    if not 0 <= cache_len <= max_len or max_len <= 0 or chars_per_token <= 0:
        raise ValueError("length_penalty needs 0 <= cache_len <= max_len, max_len > 0")
    length = len(completion) / chars_per_token
    free = max_len - cache_len
    if length <= free:
        return 0.0
    if length > max_len:
        return -1.0
    return (free - length) / cache_len


def math_verify_reward(completion: str, *, prompt: str, reference: dict[str, Any]) -> float:
    """1.0 when math-verify finds the completion's answer equivalent to the reference.

    A plain numeric answer is decided without the parser (`mathfast`, the same verdict); the
    reference's parse is kept per answer text (`_gold`), as math-verify's results are pure.
    math-verify's own timeouts use signal.alarm, which only works in a main thread; they are
    disabled here and the scorer's worker process enforces the time limit instead.
    """
    gold_text = _answer(reference)
    fast = fast_verdict(completion, gold_text)
    if fast is not None:
        return fast
    from math_verify import parse, verify

    pred = parse(completion, parsing_timeout=0)
    return float(bool(pred) and verify(list(_gold(gold_text)), pred, timeout_seconds=None))


def load_math_verify() -> Callable[..., float]:
    """The reward, with math-verify (and sympy) imported now: a worker loads it before it
    serves, so the import (a second or more) never counts against a call's timeout."""
    import math_verify  # noqa: F401

    return math_verify_reward


@lru_cache(maxsize=256)
def _gold(gold_text: str) -> tuple[Any, ...]:
    """math-verify's parse of a reference answer (raises when it has none)."""
    from math_verify import parse

    gold = parse(gold_text, parsing_timeout=0)
    if not gold and "$" not in gold_text:
        gold = parse(f"${gold_text}$", parsing_timeout=0)
    if not gold:
        raise ValueError(f"math-verify cannot parse the reference answer {gold_text!r}")
    return tuple(gold)
