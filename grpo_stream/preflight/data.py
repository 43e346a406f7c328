"""Checks of a run's data before any service starts: task, evaluation set, rewards.

`check_data(cfg)` builds the training task and its first problem (a dataset is opened
memory-mapped; columns, split, emptiness and templates are checked), the evaluation set and
its disjointness from training, and every reward spec (user functions imported, a reward
model's head read from its config, not its weights); then every built-in and user reward of
a single-turn run is called once, sandboxed, on a sample completion of the task's first
problem (`preflight.rewards`), so a reward that cannot score the task (exact_match on a task
without reference answers, a user reward reading a key the reference lacks) is refused,
naming its file and line, before any service starts.
It raises DataCheckError with one line; `grpo-stream up` calls it, and pre-flight may too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_stream.evaluator.online import check_disjoint, eval_task_settings, make_eval_set
from grpo_stream.models.loading import load_tokenizer
from grpo_stream.preflight.rewards import RewardCallError, check_reward_calls
from grpo_stream.rewards import RewardLoadError, load_reward, reward_specs
from grpo_stream.rewards.reward_model import check_head
from grpo_stream.tasks import TaskDataError, make_task, validate_task

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
        calls = [(cfg.task.name, task.problem(0), specs)]
        if cfg.eval.every > 0:
            settings, held_out = eval_task_settings(cfg), make_eval_set(cfg, tokenizer)
            first = held_out.problem(0)
            check_disjoint(cfg, tokenizer)
            calls.append((settings.name, first, reward_specs(settings, held_out)))
        for spec in [spec for _, _, specs in calls for spec in specs]:
            if spec.name == "reward_model" and spec.path is not None:
                check_head(spec.path)
            else:
                load_reward(spec)
        if not cfg.env.enabled:  # episodes are scored by their environment
            for name, problem, called in calls:
                check_reward_calls(name, problem, called, cfg.scorer)
    except (TaskDataError, RewardLoadError, RewardCallError) as exc:
        raise DataCheckError(str(exc).splitlines()[0]) from None
    except (OSError, ValueError) as exc:  # a tokenizer or chat template that does not load
        raise DataCheckError(f"task: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    return columns
