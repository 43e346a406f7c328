"""countdown (TinyZero): reach a target with + - * / over given numbers, each used at most once.

Invariants: every problem is solvable — the target is the value of an expression built from
the problem's own numbers (positive integer intermediate results, exact divisions only); the
reference holds `numbers` (list of int) and `target` (int), which is what the countdown
reward checks an `<answer>` equation against.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.tasks.base import Problem, chat_prompt, problem_rng

MIN_NUMBER = 1
MAX_NUMBER = 99
MAX_TARGET = 999
_TRIES = 64

PROMPT = (
    "Using the numbers {numbers}, create an equation that equals {target}. "
    "You can use basic arithmetic operations (+, -, *, /) and each number at most once. "
    "Show your work in <think> </think> tags. And return the final equation in "
    "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
)


def _combine(a: int, b: int, op: str) -> int | None:
    """a op b when it is a positive integer, else None."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a > b else None
    if op == "*":
        return a * b
    return a // b if b and a % b == 0 else None


def solvable_target(rng: random.Random, numbers: list[int]) -> int:
    """The value of a random left-to-right expression over a shuffled copy of `numbers`."""
    for _ in range(_TRIES):
        order = rng.sample(numbers, len(numbers))
        value: int | None = order[0]
        for n in order[1:]:
            if value is None:
                break
            value = _combine(value, n, rng.choice("+-*/"))
        if value is not None and 1 <= value <= MAX_TARGET:
            return value
    return sum(numbers)  # always reachable: every number added once


@dataclass(frozen=True)
class CountdownTask:
    """An endless stream of countdown problems."""

    seed: int = 0
    count: int = 3
    tokenizer: Any = None
    chat_template: bool = False
    name: str = "countdown"
    size: int | None = None

    def problem(self, index: int) -> Problem:
        rng = problem_rng(self.name, self.seed, index)
        numbers = [rng.randint(MIN_NUMBER, MAX_NUMBER) for _ in range(self.count)]
        target = solvable_target(rng, numbers)
        text = PROMPT.format(numbers=numbers, target=target)
        prompt = chat_prompt(self.tokenizer, text) if self.chat_template else text + "\n"
        return Problem(index, prompt, {"numbers": numbers, "target": target})

    def default_rewards(self) -> list[RewardSpec]:
        return [
            RewardSpec(name="countdown", weight=1.0),
            RewardSpec(name="format", weight=0.1),
        ]
