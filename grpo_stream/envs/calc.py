"""`calc`: arithmetic where the policy may call a calculator tool.

The task's prompt is an expression and `=`, e.g. `37*48=`. Each policy turn is either

- a tool call: a reply containing `<calc>EXPR</calc>`. The environment answers with the
  value in brackets, `[1776]`, or `[error: ...]` for an expression the calculator refuses
  (malformed, division by zero, a number or exponent past the bounds); reward 0, and the
  episode goes on (until `turns` replies);
- or the final answer: any other reply. Its answer is the last integer in the reply
  (`-?[0-9]+`); reward 1 when it equals the problem's value, 0 otherwise, and the
  episode ends.

So the outcome reward is 1 for a right final answer within `turns` replies, else 0 (no
per-turn shaping). The calculator (`evaluate`) never calls `eval`: it parses with `ast` and
walks only numbers, + - * / // % **, unary minus/plus and parentheses, with bounded input
length, bounded magnitude of every intermediate value and a bounded exponent.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from typing import Any

from grpo_stream.envs.base import Step

MAX_CHARS = 200
"""Longest expression the calculator parses."""
MAX_MAGNITUDE = 10**15
"""Largest absolute value of any number in (or computed by) an expression."""
MAX_EXPONENT = 16
"""Largest exponent of `**` (and no negative ones)."""

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
_INTEGER = re.compile(r"-?[0-9]+")


class CalcError(ValueError):
    """The calculator refuses an expression (the message says why)."""


def evaluate(expr: str) -> Number:
    """The value of an arithmetic expression; CalcError for anything else."""
    if len(expr) > MAX_CHARS:
        raise CalcError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError("malformed expression") from None
    return _value(tree.body)


def _value(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalcError(f"not a number: {value!r}")
        return _bounded(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _value(node.operand)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_exponent(right)
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
            raise CalcError("division by zero")
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except OverflowError:
            raise CalcError("number too large") from None
    raise CalcError(f"unsupported {type(node).__name__}")


def _check_exponent(exponent: Number) -> None:
    if not isinstance(exponent, int) or not 0 <= exponent <= MAX_EXPONENT:
        raise CalcError(f"exponent must be an integer in 0..{MAX_EXPONENT}")


def _bounded(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError("number too large")
    if abs(value) > MAX_MAGNITUDE:
        raise CalcError("number too large")
    return value


def calculate(expr: str) -> str:
    """What the tool answers: the value as text (an integral value without a decimal
    point, others to 6 decimals), or `error: ...`."""
    try:
        value = evaluate(expr)
    except CalcError as exc:
        return f"error: {exc}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.6f}".rstrip("0").rstrip(".")


def final_answer(text: str) -> int | None:
    """The answer of a final reply: its last integer, or None."""
    found = _INTEGER.findall(text)
    return int(found[-1]) if found else None


class CalcEnv:
    """One calc problem: tool calls until a final answer, at most `turns` replies."""

    replayable = True
    """Observations and rewards are a function of the prompt, the reference and the
    actions: a scorer recomputes its episodes (`grpo_stream.envs.replay`)."""

    def __init__(self, turns: int = 3) -> None:
        self.turns = turns
        self.answer = self.turn = 0

    def reset(self, prompt: str, reference: dict[str, Any]) -> None:
        self.answer = int(reference["answer"])
        self.turn = 0

    def step(self, action: str) -> Step:
        self.turn += 1
        last = self.turn >= self.turns
        call = _CALL.search(action)
        if call is not None:
            return Step(f"[{calculate(call.group(1))}]", 0.0, last)
        if "<calc>" in action:
            return Step("[error: <calc> without </calc>]", 0.0, last)
        right = final_answer(action) == self.answer
        return Step("", 1.0 if right else 0.0, True)
