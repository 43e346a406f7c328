"""Sampling in the words every room shares: how to sample (`Sampling`) and what sampling
produces, a `Completion` (tokens, their behaviour log-probs, text) and a `GroupSample` (the G
completions of one prompt).

Engines take a `Sampling` and make the others (`grpo_stream.engines.base` states the
conventions they keep), agents and environments assemble them turn by turn, and the generator
service turns them into Rollouts. This module imports nothing heavy and nothing of the
project: it sits on the ground floor.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

_SEED_SPACE = 2**63  # derived seeds stay in torch's and vLLM's seed range


class SamplingSettings(Protocol):
    """Anything that says how to sample: the wire's `protocols.structs.SamplingParams` (a
    PromptBatch's), the run's `GeneratorSettings`."""

    @property
    def max_tokens(self) -> int: ...

    @property
    def temperature(self) -> float: ...

    @property
    def top_p(self) -> float: ...


@dataclass(frozen=True)
class Sampling:
    """How one engine call samples: at most `max_tokens` tokens per completion from
    `softmax(logits / temperature)` within the nucleus `top_p`, drawn from a generator seeded
    with `seed` (None: unseeded). Every engine, environment and agent call takes one.

    Why a record beside the wire's `SamplingParams` rather than that struct itself: the wire
    says how a group *was* sampled (the hub sets it, the trainer computes log-probs at its
    temperature) and carries no seed, which is the generator's own business (one per lease,
    group, episode turn or agent call, derived by `child`); adding one would change the
    protocol and its golden vectors. The wire struct also stands on the protocol's floor and
    checks types, not ranges. `Sampling.of` reads a `SamplingParams` (or the run's settings)
    without importing it, so this module stays on the ground floor.

    Invariant: a `Sampling` that exists is valid: `max_tokens >= 1`, `temperature > 0`
    (greedy decoding is not supported: behaviour log-probs need a distribution) and
    `0 < top_p <= 1`, checked once here rather than by every engine."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1 (got {self.max_tokens})")
        if self.temperature <= 0:
            raise ValueError(
                f"temperature must be positive (got {self.temperature}): greedy decoding is "
                "not supported"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")

    @classmethod
    def of(cls, settings: SamplingSettings, seed: int | None = None) -> Sampling:
        """The sampling `settings` (a PromptBatch's `SamplingParams`, ...) describe."""
        return cls(settings.max_tokens, settings.temperature, settings.top_p, seed)

    def child(self, index: int, max_tokens: int | None = None) -> Sampling:
        """The sampling of call `index` made under this one (an episode's turn, an agent
        batch): its seed derived from this seed and `index` (None stays None), at most
        `max_tokens` tokens when given."""
        seed = None if self.seed is None else (self.seed * 1_000_003 + index) % _SEED_SPACE
        return replace(
            self, seed=seed, max_tokens=self.max_tokens if max_tokens is None else max_tokens
        )


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
