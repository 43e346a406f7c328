"""countdown: deterministic, solvable problems with numbers and a target."""

from __future__ import annotations

import itertools
from fractions import Fraction

from grpo_stream.tasks import CountdownTask, TaskSettings, make_task


def _reachable(numbers: list[int], target: int) -> bool:
    """Brute force: some ordering and operators, combined left to right, reach target."""
    ops = [
        lambda a, b: a + b,
        lambda a, b: a - b,
        lambda a, b: a * b,
        lambda a, b: a / b if b else None,
    ]
    for order in itertools.permutations(numbers):
        for chosen in itertools.product(ops, repeat=len(order) - 1):
            value: Fraction | None = Fraction(order[0])
            for op, n in zip(chosen, order[1:], strict=True):
                value = None if value is None else op(value, Fraction(n))
            if value == target:
                return True
    return False


def test_reference_holds_numbers_and_target() -> None:
    p = make_task(TaskSettings(name="countdown", countdown_numbers=4)).problem(0)
    assert len(p.reference["numbers"]) == 4
    assert all(isinstance(n, int) and 1 <= n <= 99 for n in p.reference["numbers"])
    assert isinstance(p.reference["target"], int)
    assert str(p.reference["target"]) in p.prompt
    assert "<answer>" in p.prompt


def test_every_problem_is_solvable() -> None:
    task = CountdownTask(seed=0, count=3)
    for i in range(60):
        ref = task.problem(i).reference
        assert 1 <= ref["target"] <= 999
        assert _reachable(ref["numbers"], ref["target"]), ref


def test_same_seed_same_problems_and_resumable() -> None:
    a = make_task(TaskSettings(name="countdown", seed=5))
    b = make_task(TaskSettings(name="countdown", seed=5))
    assert [a.problem(i) for i in range(30)] == [b.problem(i) for i in range(30)]
    assert b.problem(17) == a.problem(17)


def test_default_rewards_are_countdown_and_format() -> None:
    specs = make_task(TaskSettings(name="countdown")).default_rewards()
    assert [(s.name, s.weight) for s in specs] == [("countdown", 1.0), ("format", 0.1)]
