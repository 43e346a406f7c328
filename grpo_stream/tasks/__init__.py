"""Tasks: deterministic, indexable streams of verifiable problems.

`make_task(settings)` builds the task a run config names (arith, countdown, dataset, math,
reasoning_gym:<dataset>, verifiers:package.module:factory), the training part when
`task.holdout` keeps prompts out for evaluation; `make_eval_task` builds the evaluation
part. `task.problem(i)` depends only on the settings and `i`, so the hub's dataset cursor
is a single integer.
"""

from __future__ import annotations

from typing import Any, Literal

from grpo_stream.config.tasks import (
    GSM8K_ANSWER_REGEX,
    GYM_PREFIX,
    VERIFIERS_PREFIX,
    RewardSpec,
    TaskSettings,
)
from grpo_stream.tasks.arith import ArithTask
from grpo_stream.tasks.base import Problem, Task
from grpo_stream.tasks.countdown import CountdownTask
from grpo_stream.tasks.dataset import DatasetTask, TaskDataError
from grpo_stream.tasks.guess import GuessTask
from grpo_stream.tasks.gym import ReasoningGymTask
from grpo_stream.tasks.holdout import HeldOut, held_out
from grpo_stream.tasks.verifiers import VerifiersTask

__all__ = [
    "ArithTask",
    "CountdownTask",
    "DatasetTask",
    "HeldOut",
    "Problem",
    "RewardSpec",
    "Task",
    "TaskDataError",
    "TaskSettings",
    "held_out",
    "make_eval_task",
    "make_task",
    "validate_task",
]


def _base_task(settings: TaskSettings, tokenizer: Any) -> Task:
    if settings.name == "arith":
        return ArithTask(seed=settings.seed, max_operand=settings.max_operand, ops=settings.ops)
    if settings.name == "countdown":
        return CountdownTask(
            seed=settings.seed,
            count=settings.countdown_numbers,
            tokenizer=tokenizer,
            chat_template=settings.chat_template,
        )
    if settings.name == "guess":
        return GuessTask(seed=settings.seed, high=settings.guess_max)
    if settings.name == "calc":  # arith's problems, all three operators, for the calc env
        return ArithTask(seed=settings.seed, max_operand=settings.calc_max, ops="+-*", name="calc")
    if settings.name.startswith(VERIFIERS_PREFIX):
        spec = settings.name[len(VERIFIERS_PREFIX) :]
        return VerifiersTask(spec, tokenizer, chat_template=settings.chat_template)
    if settings.name.startswith(GYM_PREFIX):
        return ReasoningGymTask(settings, tokenizer)
    if settings.name == "math":
        if settings.path is None and settings.dataset is None:
            raise TaskDataError("task.name = 'math' needs task.path (a JSONL or Parquet file)")
        return DatasetTask.from_settings(settings, tokenizer, answer_regex=GSM8K_ANSWER_REGEX)
    return DatasetTask.from_settings(settings, tokenizer)


def make_task(
    settings: TaskSettings, tokenizer: Any = None, part: Literal["train", "eval"] = "train"
) -> Task:
    """The task named by `settings` (its `part` when task.holdout > 0); `tokenizer` is needed
    only for chat templates."""
    task = _base_task(settings, tokenizer)
    if settings.holdout > 0:
        return HeldOut(task, settings.holdout, part)
    if part == "eval":
        raise TaskDataError("an evaluation part needs task.holdout > 0 (or set eval.task)")
    return task


def make_eval_task(settings: TaskSettings, tokenizer: Any = None) -> Task:
    """The held-out part of the training task `settings` (task.holdout > 0)."""
    return make_task(settings, tokenizer, part="eval")


def validate_task(settings: TaskSettings, tokenizer: Any = None) -> list[str]:
    """Build the task and its first problem (what pre-flight checks call; cheap: a dataset is
    opened memory-mapped, a generator builds one entry). Raises TaskDataError with one line;
    returns the dataset's columns ([] for generated tasks)."""
    task = make_task(settings, tokenizer)
    task.problem(0)
    inner = task.task if isinstance(task, HeldOut) else task
    return list(inner.columns) if isinstance(inner, DatasetTask) else []
