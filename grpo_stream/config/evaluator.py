"""Settings of evaluation during training (the `evaluator` service) and their checks."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grpo_stream.config.tasks import TaskSettings


class EvalSettings(BaseModel):
    """Held-out evaluation while the run trains: a dedicated evaluator process follows the
    trainer's weights and writes RUN_DIR/eval.jsonl; it never blocks the trainer."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    every: int = Field(0, ge=0)
    """Evaluate every this many trainer steps (policy versions), and once before training;
    0 turns evaluation during training off (no evaluator process starts)."""
    task: TaskSettings | None = None
    """The evaluation task (e.g. the dataset's test split); None: the training task's held-out
    part, which needs task.holdout > 0. It must share no prompt with training."""
    problems: int = Field(64, ge=1)
    """Problems evaluated each time (the same ones every time)."""
    k: int = Field(4, ge=1)
    """Completions sampled per problem: pass@1 and pass@k are reported."""
    greedy: bool = False
    """Greedy decoding (the most likely token each step) instead of sampling; needs k = 1."""
    temperature: float | None = Field(None, gt=0)
    """Sampling temperature; None uses generator.temperature."""
    max_tokens: int | None = Field(None, ge=1)
    """Largest completion; None uses generator.max_tokens."""
    device: str | None = None
    """The evaluator's device (cpu, cuda, cuda:1); None: a GPU when one is visible."""

    @model_validator(mode="after")
    def _check(self) -> EvalSettings:
        if self.greedy and self.k != 1:
            raise ValueError("eval.greedy = true gives one completion per problem: set eval.k = 1")
        return self


def check_eval_config(every: int, eval_task: TaskSettings | None, holdout: float) -> None:
    """Raise ValueError (one line) when evaluation is on but has nothing held out to see."""
    if every > 0 and eval_task is None and holdout <= 0:
        raise ValueError(
            "eval.every > 0 evaluates the training task's held-out prompts: set task.holdout "
            "(e.g. 0.1) or give eval.task"
        )
