"""Settings of the task (what prompts the hub dispatches) and its reward functions."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

TASK_NAMES = ("arith", "countdown", "math", "dataset", "guess", "calc")
GYM_PREFIX = "reasoning_gym:"
VERIFIERS_PREFIX = "verifiers:"
GSM8K_ANSWER_REGEX = r"(?s)^(?:.*####)?\s*(.*?)\s*$"
"""What follows the last `####` (GSM8K), or the whole text when there is none."""


class RewardSpec(BaseModel):
    """One weighted reward function."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)

    name: str
    """A built-in (exact_match, math_verify, format, length_penalty, countdown, reasoning_gym),
    `python` (with `import`), `reward_model` or `judge` (with `path`), or `pkg.mod:fn`."""
    weight: float = 1.0
    """Weight of this component in the scalar reward."""
    params: dict[str, float | int | str | bool] = {}
    """Keyword arguments passed to the reward function."""
    import_: str | None = Field(None, alias="import", serialization_alias="import")
    """name = "python": the user function, `package.module:function`, called as
    fn(completion, *, prompt, reference, **params) -> float."""
    path: str | None = None
    """name = "reward_model": a local path or Hugging Face name of a transformers
    sequence-classification model with one label; its logit on prompt + completion is the
    reward (params: device = "cpu" | "cuda" | "auto", batch_size, max_length).
    name = "judge": a causal LM that reads a rubric and writes a score (grpo_stream.rewards.judge;
    params: template, pattern, max_score, max_tokens, batch_size, device, chat, cache_size)."""

    @model_validator(mode="after")
    def _check_kind(self) -> RewardSpec:
        if (self.name == "python") != (self.import_ is not None):
            raise ValueError('`import` goes with name = "python" (and only with it)')
        if (self.name in ("reward_model", "judge")) != (self.path is not None):
            raise ValueError('`path` goes with name = "reward_model" or "judge" (and only them)')
        return self


class TaskSettings(BaseModel):
    """The prompt source and its verifiers."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = "arith"
    """arith (default, integer arithmetic), countdown (TinyZero), guess (episodes, with
    env.name = "guess"), calc (episodes with a calculator tool, env.name = "calc"), dataset
    (a Hugging Face dataset or local Parquet/JSONL/CSV/Arrow file), math (alias of dataset
    for a local file with GSM8K answers), reasoning_gym:<dataset> (procedural tasks of
    reasoning-gym), or verifiers:package.module:factory (a verifiers environment's taskset,
    played with env.name = "grpo_stream.envs.verifiers_adapter:VerifiersEnv")."""
    seed: int = 0
    """Seed of the prompt stream: the same seed gives the same prompts in the same order."""
    max_operand: int = Field(20, ge=1)
    """arith: largest operand."""
    ops: str = "+"
    """arith: operators to draw from, e.g. '+-'."""
    guess_max: int = Field(16, ge=2, le=10_000)
    """guess: the hidden number is in 1..guess_max (play it with env.name = "guess")."""
    calc_max: int = Field(99, ge=1, le=10**6)
    """calc: largest operand of the `a op b =` problems (play them with env.name = "calc")."""
    countdown_numbers: int = Field(3, ge=2, le=6)
    """countdown: how many numbers each problem gives."""
    path: Path | None = None
    """math: local JSONL or Parquet file of problems (same as task.dataset)."""
    dataset: str | None = None
    """dataset: a Hugging Face dataset name (e.g. "openai/gsm8k") or a local file or
    directory loadable by `datasets` (.parquet, .jsonl, .json, .csv, .arrow, save_to_disk)."""
    subset: str | None = None
    """dataset: the configuration of a Hugging Face dataset (e.g. "main" for openai/gsm8k)."""
    split: str = "train"
    """dataset: the split to read (a single local file is the split "train")."""
    streaming: bool = False
    """dataset: stream rows instead of loading them (sets larger than the disk cache); rows
    are then visited in file order, each epoch the same."""
    prompt_field: str = "question"
    """dataset, math: the column holding the problem text (when there is no prompt_template)."""
    prompt_template: str | None = None
    """dataset, math, reasoning_gym: the prompt, with `{column}` replaced by that column's
    value (other braces stay as is); None uses prompt_field's text as is."""
    answer_field: str = "answer"
    """dataset, math: the column holding the reference answer."""
    answer_regex: str | None = None
    """dataset, math: the reference is this regex's first group (or whole match) in the
    answer column, e.g. "####\\s*(.+)$" for GSM8K; math defaults to GSM8K's `####` rule."""
    family_field: str | None = None
    """dataset, math: a column naming each problem's family (a difficulty level, a source, a
    topic); hub.curriculum then keeps one pass rate per family instead of one per prompt."""
    system_prompt: str | None = None
    """dataset, math, reasoning_gym: a system turn before the prompt (needs chat_template)."""
    chat_template: bool = False
    """dataset, math, countdown, reasoning_gym: wrap the prompt with the tokenizer's chat
    template (instruct models)."""
    params: dict[str, float | int | str | bool | list[float | int | str]] = {}
    """reasoning_gym: the dataset's own parameters, passed to reasoning_gym.create_dataset."""
    size: int = Field(10_000, ge=1)
    """reasoning_gym: distinct problems generated before the stream repeats."""
    holdout: float = Field(0.0, ge=0.0, le=0.5)
    """Fraction of prompts (by a hash of the prompt text) kept out of training for
    evaluation: the training stream never shows them, eval (without eval.task) sees only them."""
    rewards: list[RewardSpec] | None = None
    """Reward functions and weights; None uses the task's defaults."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if name in TASK_NAMES:
            return name
        if name.startswith(GYM_PREFIX) and len(name) > len(GYM_PREFIX):
            return name
        if name.startswith(VERIFIERS_PREFIX) and ":" in name[len(VERIFIERS_PREFIX) :]:
            return name
        raise ValueError(
            f"must be one of {', '.join(TASK_NAMES)}, reasoning_gym:<dataset> or "
            "verifiers:package.module:factory"
        )

    @field_validator("ops")
    @classmethod
    def _check_ops(cls, ops: str) -> str:
        if not ops or set(ops) - set("+-*"):
            raise ValueError("must be one or more of the characters + - *")
        return ops

    @field_validator("answer_regex")
    @classmethod
    def _check_regex(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return pattern

    @model_validator(mode="after")
    def _check_chat(self) -> TaskSettings:
        if self.system_prompt is not None and not self.chat_template:
            raise ValueError("task.system_prompt needs task.chat_template = true")
        if self.family_field is not None and self.name not in ("dataset", "math"):
            raise ValueError(
                f"task.family_field names a column of a dataset: task.name is {self.name!r}, "
                "not dataset or math"
            )
        return self
