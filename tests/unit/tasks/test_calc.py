"""calc: deterministic `a op b =` problems (arith's, all three operators) whose reference
is the value the calculator gives."""

from __future__ import annotations

import re

from grpo_stream.envs.calc import evaluate
from grpo_stream.tasks import TaskSettings, make_task


def test_problems_are_bounded_expressions_whose_reference_is_their_value() -> None:
    task = make_task(TaskSettings(name="calc", calc_max=30))
    for i in range(200):
        p = task.problem(i)
        expr = p.prompt.removesuffix("=")
        parts = re.fullmatch(r"(\d+)[+*-](\d+)=", p.prompt)
        assert parts is not None and all(0 <= int(x) <= 30 for x in parts.groups())
        assert p.reference == {"answer": str(evaluate(expr))}


def test_the_same_seed_gives_the_same_problems_and_all_operators_appear() -> None:
    a, b = (make_task(TaskSettings(name="calc", seed=5)) for _ in range(2))
    prompts = [a.problem(i).prompt for i in range(100)]
    assert prompts == [b.problem(i).prompt for i in range(100)]
    assert {op for op in "+-*" if any(op in p for p in prompts)} == set("+-*")
