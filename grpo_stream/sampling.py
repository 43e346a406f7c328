"""What sampling produces, in the words every room shares: a `Completion` (tokens, their
behaviour log-probs, text) and a `GroupSample` (the G completions of one prompt).

Engines make them (`grpo_stream.engines.base` states the conventions they keep), agents and
environments assemble them turn by turn, and the generator service turns them into Rollouts.
This module imports nothing heavy and nothing of the project: it sits on the ground floor.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Completion:
    """One sampled completion: tokens, their behaviour log-probs, decoded text."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    truncated: bool
    """True when the completion hit max_tokens without an end-of-sequence token."""
    version_runs: list[tuple[int, int]] = field(default_factory=list)
    """(first token index, weights version) per run of tokens sampled with one version, in
    order (several with in-flight updates). Empty: the engine's version sampled them all."""


@dataclass
class GroupSample:
    """The G completions sampled for one prompt."""

    prompt_ids: list[int]
    completions: list[Completion]
