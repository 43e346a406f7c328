"""Tasks: deterministic, indexable streams of verifiable problems (arith, countdown, math).

`make_task(settings)` builds the task a run config names; `task.problem(i)` depends only on
the settings and `i`, so the hub's dataset cursor is a single integer.
"""

from __future__ import annotations

from typing import Any

from grpo_stream.tasks.arith import ArithTask
from grpo_stream.tasks.base import Problem, Task
from grpo_stream.tasks.countdown import CountdownTask
from grpo_stream.tasks.math_file import MathTask, TaskDataError
from grpo_stream.tasks.settings import RewardSpec, TaskSettings

__all__ = [
    "ArithTask",
    "CountdownTask",
    "MathTask",
    "Problem",
    "RewardSpec",
    "Task",
    "TaskDataError",
    "TaskSettings",
    "make_task",
]


def make_task(settings: TaskSettings, tokenizer: Any = None) -> Task:
    """The task named by `settings`; `tokenizer` is needed only for chat templates."""
    if settings.name == "arith":
        return ArithTask(seed=settings.seed, max_operand=settings.max_operand, ops=settings.ops)
    if settings.name == "countdown":
        return CountdownTask(
            seed=settings.seed,
            count=settings.countdown_numbers,
            tokenizer=tokenizer,
            chat_template=settings.chat_template,
        )
    if settings.path is None:
        raise TaskDataError("task.name = 'math' needs task.path (a JSONL or Parquet file)")
    return MathTask.from_file(
        settings.path,
        settings.question_field,
        settings.answer_field,
        seed=settings.seed,
        prompt_template=settings.prompt_template,
        tokenizer=tokenizer,
        chat_template=settings.chat_template,
    )
