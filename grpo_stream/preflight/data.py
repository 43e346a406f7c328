"""Checks of a run's data before any service starts: task, evaluation set, rewards.

`check_data(cfg)` builds the training task and its first problem (a dataset is opened
memory-mapped; columns, split, emptiness and templates are checked), the evaluation set and
its disjointness from training, and every reward spec (user functions imported, a reward
model's head read from its config, not its weights); each built-in reward of a single-turn
run is called once on the task's first problem, so a reward that cannot score the task
(exact_match on a task without reference answers) is refused before any service starts.
It raises DataCheckError with one line; `grpo-stream up` calls it, and pre-flight may too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.evaluator.online import check_disjoint, eval_task_settings, make_eval_set
from grpo_stream.models.loading import load_tokenizer
from grpo_stream.rewards import BUILTIN, RewardLoadError, load_reward, reward_specs
from grpo_stream.rewards.reward_model import check_head
from grpo_stream.tasks import TaskDataError, make_task, validate_task
from grpo_stream.tasks.base import Problem

if TYPE_CHECKING:
    from grpo_stream.config import RunConfig


class DataCheckError(ValueError):
    """The run's data or rewards would fail once the services start; one line says why."""


def _tokenizer(cfg: RunConfig) -> Any:
    chat = cfg.task.chat_template or (cfg.eval.task is not None and cfg.eval.task.chat_template)
    if not chat:
        return None

    return load_tokenizer(cfg.model.name_or_path)


def check_data(cfg: RunConfig) -> list[str]:
    """Raise DataCheckError when the data or rewards are bad; the training set's columns."""
    try:
        tokenizer = _tokenizer(cfg)
        columns = validate_task(cfg.task, tokenizer)
        task = make_task(cfg.task, tokenizer)
        specs = reward_specs(cfg.task, task)
        if not cfg.env.enabled:  # episodes are scored by their environment
            check_builtin_rewards(cfg.task.name, task.problem(0), specs)
        if cfg.eval.every > 0:
            make_eval_set(cfg, tokenizer).problem(0)
            check_disjoint(cfg, tokenizer)
            specs += reward_specs(eval_task_settings(cfg), make_eval_set(cfg, tokenizer))
        for spec in specs:
            if spec.name == "reward_model" and spec.path is not None:
                check_head(spec.path)
            else:
                load_reward(spec)
    except DataCheckError:
        raise
    except (TaskDataError, RewardLoadError) as exc:
        raise DataCheckError(str(exc).splitlines()[0]) from None
    except (OSError, ValueError) as exc:  # a tokenizer or chat template that does not load
        raise DataCheckError(f"task: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    return columns


def check_builtin_rewards(task_name: str, problem: Problem, specs: list[RewardSpec]) -> None:
    """Call each built-in reward once on `problem` with an empty completion: one that raises
    cannot score this task (user rewards are not called here: they run sandboxed)."""
    for spec in specs:
        if spec.name not in BUILTIN:
            continue
        try:
            load_reward(spec)("", prompt=problem.prompt, reference=dict(problem.reference))
        except Exception as exc:  # a built-in that cannot score this task's problems
            keys = ", ".join(sorted(problem.reference)) or "none"
            raise DataCheckError(
                f"reward {spec.name!r} cannot score task {task_name!r}: {exc} (its problems' "
                f"reference has the keys: {keys}; a multi-turn task needs its env.name)"
            ) from None
