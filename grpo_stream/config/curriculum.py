"""Settings of the hub's curriculum from pass rates (grpo_stream.hub.curriculum)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CurriculumSettings(BaseModel):
    """Which prompts the hub lets out: every prompt of the stream (off), or mostly those whose
    recent pass rate promises a group with signal (on)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = False
    """Sample prompts by their expected signal: the hub keeps each prompt's recent pass rate
    p (by task.family_field when set, else by the prompt's text: a prompt seen again) and lets
    a prompt the stream reaches out with probability max(floor, s(p) / s(1/2)), s(p) = 1 -
    p^G - (1 - p)^G the chance that a group of G completions carries signal; a prompt not
    seen before always goes out; the others are passed over (counted as skipped). Off: every
    prompt in order. Default off: on the mixed-difficulty bench it generated 3x fewer
    zero-signal groups per trained group than uniform sampling, but no higher reward at equal
    wall time (bench.curriculum, docs/guide/curriculum.md)."""
    floor: float = Field(0.1, ge=0.01, le=1)
    """Exploration floor: a prompt is let out with at least this probability, so a prompt
    that was too easy or too hard is tried again now and then and none starves."""
    window: int = Field(4, ge=1)
    """Groups a pass rate follows: the mean of the first `window` groups of a prompt, then
    an exponential moving average with weight 1 / window on each new group."""
    pass_reward: float = 1.0
    """A completion passes when its reward is at least this (1.0: exact match's reward)."""
    max_keys: int = Field(100_000, ge=1)
    """Pass rates kept at most (prompts or families); the least recently seen is forgotten
    first, so an endless stream of new prompts keeps the table bounded."""
