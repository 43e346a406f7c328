"""math_verify's fast path: the verdict without the parser where the answer is a plain number.

`fast_verdict(completion, gold)` returns what `math_verify.verify(parse(gold), parse(completion))`
returns (1.0 or 0.0), or None where it cannot be sure; the caller then runs the parser. Most
completions of a numeric task end in a plain number, and the parser spends ~1.4 ms a call
building it through sympy's parser; this reads it with one regex.

Invariant: a verdict is given only for shapes whose extraction math_verify 0.9 decides
without ambiguity, each argued from its parser (`math_verify.parser`: candidates are tried by
priority, rightmost first within a priority):

- the gold is a plain integer (`-?(0|[1-9][0-9]*)`: no sign, leading zeros, separators or
  decimals, which math_verify turns into other numbers), or the completion is the gold
  string itself (`parse` of the same string gives the same candidates, which verify equal);
- *last number*: the text holds no LaTeX trigger (`$`, `\\`, `[`) and no "answer", and ends
  in an integer (then an optional `.` and white space) that starts the text or follows white
  space or `=`, and the first character before that white space cannot belong to an
  arithmetic expression (a digit of any script, `.`, operators, brackets). Only the
  plain-number patterns (priority 300) can match; the rightmost is this integer, since an
  expression ending there would have to contain that character;
- *the answer is N*: the same, but "answer" occurs once (never "final answer") and the text
  ends in `answer is N`: the one match of the "answer" pattern (priority 200) is N;
- *boxed*: the text's one backslash opens a `\\boxed{N}` that ends it (then an optional `.`
  and white space), with no `$`, `[` or "final answer": only the boxed pattern (priority 50)
  matches, and it reads N.

Every verdict is the integers' equality, which is what verify says of two sympy Integers
(and of their strings). tests/unit/rewards/test_mathfast.py compares it with the plain
library call on a corpus of both shapes and their near misses.
"""

from __future__ import annotations

import re

_INTEGER = r"-?(?:0|[1-9][0-9]*)"
_GOLD_INTEGER = re.compile(_INTEGER)
_GOLD_DECIMAL = re.compile(rf"{_INTEGER}\.[0-9]+")
_TAIL = re.compile(rf"({_INTEGER})\.?\s*\Z")
_ANSWER_IS = re.compile(rf"answer is ({_INTEGER})\.?\s*\Z", re.IGNORECASE)
_BOXED = re.compile(rf"\\boxed\{{({_INTEGER})\}}\.?\s*\Z")
_OPERATORS = frozenset(".+-*×/^()÷")
"""Characters besides digits (any script's: its pattern's `\\d`) and white space that
math_verify's expression pattern may span."""
_LATEX = ("$", "\\", "[")


def fast_verdict(completion: str, gold: str) -> float | None:
    """1.0 or 0.0 as math_verify would score `completion` against the answer `gold`; None
    where only its parser can tell."""
    text = completion.strip()
    if text == gold and (_GOLD_INTEGER.fullmatch(gold) or _GOLD_DECIMAL.fullmatch(gold)):
        return 1.0
    if not _GOLD_INTEGER.fullmatch(gold):
        return None
    found = _answer(completion)
    return None if found is None else float(int(found) == int(gold))


def _answer(completion: str) -> str | None:
    """The integer math_verify extracts from `completion`, where one of the shapes above
    makes it certain; else None."""
    lower = completion.lower()
    if "final answer" in lower:
        return None
    if "$" in completion or "[" in completion:
        return None
    if "\\" in completion:
        boxed = _BOXED.search(completion)
        return boxed.group(1) if boxed and completion.count("\\") == 1 else None
    answers = lower.count("answer")
    if answers == 1:
        said = _ANSWER_IS.search(completion)
        return said.group(1) if said else None
    if answers:
        return None
    tail = _TAIL.search(completion)
    if tail is None or not _stands_alone(completion, tail.start(1)):
        return None
    return tail.group(1)


def _stands_alone(text: str, start: int) -> bool:
    """The number at `start` begins the text or follows white space or `=`, and no
    arithmetic expression can reach it from the left."""
    if start > 0 and not (text[start - 1].isspace() or text[start - 1] == "="):
        return False
    before = text[:start].rstrip()
    return not before or not (before[-1].isdecimal() or before[-1] in _OPERATORS)
