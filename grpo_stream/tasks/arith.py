"""arith: integer arithmetic `a+b=` problems, the default task of the tiny model.

Invariants: operands are drawn uniformly from 0..max_operand and the operator uniformly from
`ops`; the prompt is exactly `f"{a}{op}{b}="` (what the tiny model was warm-started on) and
the reference answer is the decimal string of the exact result.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.tasks.base import Problem, problem_rng

OPERATORS = "+-*"


@dataclass(frozen=True)
class ArithTask:
    """An endless stream of `a op b =` problems."""

    seed: int = 0
    max_operand: int = 20
    ops: str = "+"
    name: str = "arith"
    size: int | None = None

    def __post_init__(self) -> None:
        bad = sorted(set(self.ops) - set(OPERATORS))
        if not self.ops or bad:
            raise ValueError(f"task.ops must be made of {OPERATORS!r}, got {self.ops!r}")

    def problem(self, index: int) -> Problem:
        rng = problem_rng(self.name, self.seed, index)
        a = rng.randint(0, self.max_operand)
        b = rng.randint(0, self.max_operand)
        op = rng.choice(self.ops)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return Problem(index=index, prompt=f"{a}{op}{b}=", reference={"answer": str(value)})

    def default_rewards(self) -> list[RewardSpec]:
        return [RewardSpec(name="exact_match", weight=1.0)]
