"""Settings of the task (what prompts the hub dispatches) and its reward functions."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class RewardSpec(BaseModel):
    """One weighted reward function."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str
    """A built-in (exact_match, math_verify, format, length_penalty, countdown) or `pkg.mod:fn`."""
    weight: float = 1.0
    """Weight of this component in the scalar reward."""
    params: dict[str, float | int | str | bool] = {}
    """Keyword arguments passed to the reward function."""


class TaskSettings(BaseModel):
    """The prompt source and its verifiers."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: Literal["arith", "countdown", "math"] = "arith"
    """arith (default, integer arithmetic), countdown (TinyZero), or math (local JSONL/Parquet)."""
    seed: int = 0
    """Seed of the prompt stream: the same seed gives the same prompts in the same order."""
    max_operand: int = Field(20, ge=1)
    """arith: largest operand."""
    ops: str = "+"
    """arith: operators to draw from, e.g. '+-'."""
    countdown_numbers: int = Field(3, ge=2, le=6)
    """countdown: how many numbers each problem gives."""
    path: Path | None = None
    """math: local JSONL or Parquet file of problems."""
    question_field: str = "question"
    """math: field holding the problem text."""
    answer_field: str = "answer"
    """math: field holding the reference answer."""
    prompt_template: str = "{question}"
    """math: the prompt; `{question}` is replaced by the problem text (other braces stay as is)."""
    chat_template: bool = False
    """math, countdown: wrap the prompt with the tokenizer's chat template (instruct models)."""
    rewards: list[RewardSpec] | None = None
    """Reward functions and weights; None uses the task's defaults."""

    @field_validator("ops")
    @classmethod
    def _check_ops(cls, ops: str) -> str:
        if not ops or set(ops) - set("+-*"):
            raise ValueError("must be one or more of the characters + - *")
        return ops
