"""arith: deterministic, resumable `a op b =` problems."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from grpo_stream.tasks import ArithTask, Task, TaskSettings, make_task


def test_default_task_is_arith_with_exact_match() -> None:
    task = make_task(TaskSettings())
    assert isinstance(task, Task)
    assert task.name == "arith"
    assert task.size is None
    assert [s.name for s in task.default_rewards()] == ["exact_match"]


def test_same_seed_gives_the_same_problems() -> None:
    a, b = make_task(TaskSettings(seed=3)), make_task(TaskSettings(seed=3))
    assert [a.problem(i) for i in range(50)] == [b.problem(i) for i in range(50)]


def test_other_seed_gives_other_problems() -> None:
    a, b = make_task(TaskSettings(seed=0)), make_task(TaskSettings(seed=1))
    assert [a.problem(i).prompt for i in range(20)] != [b.problem(i).prompt for i in range(20)]


def test_problem_depends_only_on_its_index_so_a_cursor_resumes() -> None:
    task = make_task(TaskSettings())
    stream = [task.problem(i) for i in range(100)]
    resumed = make_task(TaskSettings())
    assert [resumed.problem(i) for i in range(60, 100)] == stream[60:]


def test_prompt_format_and_answer() -> None:
    task = ArithTask(seed=0, max_operand=20, ops="+")
    for i in range(200):
        p = task.problem(i)
        a, b = p.prompt.removesuffix("=").split("+")
        assert p.prompt.endswith("=")
        assert 0 <= int(a) <= 20 and 0 <= int(b) <= 20
        assert p.reference == {"answer": str(int(a) + int(b))}
        assert p.index == i


def test_every_listed_operator_appears_and_answers_are_exact() -> None:
    task = ArithTask(seed=0, max_operand=9, ops="+-*")
    seen = set()
    for i in range(300):
        p = task.problem(i)
        op = next(c for c in "+-*" if c in p.prompt[1:])
        a, b = (int(x) for x in p.prompt[:-1].split(op, 1))
        seen.add(op)
        assert int(p.reference["answer"]) == {"+": a + b, "-": a - b, "*": a * b}[op]
    assert seen == {"+", "-", "*"}


def test_negative_index_is_refused() -> None:
    with pytest.raises(ValueError, match="index"):
        make_task(TaskSettings()).problem(-1)


def test_unknown_operator_is_a_config_error() -> None:
    with pytest.raises(ValidationError, match="ops"):
        TaskSettings(ops="+/")
