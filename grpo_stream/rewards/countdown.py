"""The countdown verifier: a small recursive-descent parser over + - * / ( ) and integers.

Invariants: nothing is ever evaluated by Python (`eval`, `ast` compile); any character other
than digits, the four operators, parentheses and spaces is refused, as are `**`, names,
calls and attribute access; input length, literal size and nesting depth are bounded, so a
hostile completion costs microseconds; arithmetic is exact (Fraction), division by zero is
refused.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from grpo_stream.rewards.text import tagged

MAX_CHARS = 256
MAX_DIGITS = 6
MAX_DEPTH = 32
_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")


class ExpressionError(ValueError):
    """The text is not an expression this verifier accepts."""


def tokenize(text: str) -> list[str]:
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"longer than {MAX_CHARS} characters")
    tokens: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ExpressionError(f"unexpected character {text[pos:].lstrip()[:1]!r}")
        number, op = match.groups()
        if number is not None and len(number) > MAX_DIGITS:
            raise ExpressionError(f"number longer than {MAX_DIGITS} digits")
        tokens.append(number if number is not None else op)
        pos = match.end()
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ;
    factor := '-' factor | '(' expr ')' | INT"""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.numbers: list[int] = []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ExpressionError("expression ends too early")
        self.pos += 1
        return token

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            value = value + self.term(depth) if self.take() == "+" else value - self.term(depth)
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            if self.take() == "*":
                value *= self.factor(depth)
                continue
            divisor = self.factor(depth)
            if divisor == 0:
                raise ExpressionError("division by zero")
            value /= divisor
        return value

    def factor(self, depth: int) -> Fraction:
        if depth > MAX_DEPTH:
            raise ExpressionError(f"nested deeper than {MAX_DEPTH}")
        token = self.take()
        if token == "-":
            return -self.factor(depth + 1)
        if token == "(":
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise ExpressionError("unbalanced parentheses")
            return value
        if token.isdigit():
            self.numbers.append(int(token))
            return Fraction(int(token))
        raise ExpressionError(f"unexpected {token!r}")


def evaluate(text: str) -> tuple[Fraction, list[int]]:
    """The exact value of an arithmetic expression and the integer literals it uses."""
    tokens = tokenize(text)
    if not tokens:
        raise ExpressionError("empty expression")
    parser = _Parser(tokens)
    value = parser.expr(0)
    if parser.peek() is not None:
        raise ExpressionError(f"unexpected {parser.peek()!r}")
    return value, parser.numbers


def uses_at_most(used: list[int], given: list[int], use_all: bool) -> bool:
    """Each given number used at most once (exactly once with `use_all`), and nothing else."""
    pool = list(given)
    for n in used:
        if n not in pool:
            return False
        pool.remove(n)
    return not (use_all and pool)


def check_equation(text: str, numbers: list[int], target: int, use_all: bool = False) -> bool:
    """True when `text` (optionally `... = target`) reaches `target` with the given numbers."""
    lhs, eq, rhs = text.partition("=")
    if eq and rhs.strip() != str(target):
        return False
    try:
        value, used = evaluate(lhs)
    except ExpressionError:
        return False
    return value == target and uses_at_most(used, numbers, use_all)


def countdown(
    completion: str,
    *,
    prompt: str,
    reference: dict[str, Any],
    answer_tag: str = "answer",
    require_tag: bool = True,
    use_all: bool = False,
) -> float:
    """1.0 when the equation in the last <answer> tag reaches the target, else 0.0."""
    answer = tagged(completion, answer_tag)
    if answer is None:
        if require_tag:
            return 0.0
        answer = completion
    numbers = [int(n) for n in reference["numbers"]]
    return float(check_equation(answer, numbers, int(reference["target"]), use_all))
