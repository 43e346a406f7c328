"""The environment interface: what a multi-turn task implements.

An episode starts from a task problem (its prompt and reference). Each turn the policy
generates one reply; the environment answers with a `Step`: observation text (feedback, a
tool's result) that becomes the next user turn, an optional per-turn reward, and whether the
episode is over. Environments are plain Python objects built once per episode inside a
sandboxed worker process (`grpo_stream.envs.sandbox`); they never see token ids.

    class MyEnv:
        def __init__(self, **params): ...
        def reset(self, prompt: str, reference: dict[str, Any]) -> None: ...
        def step(self, action: str) -> Step: ...

An environment whose observations and rewards are a function of the prompt, the reference
and the actions so far says so with a class attribute `replayable = True`: a scorer then
replays each episode's actions against a fresh instance and its rewards are the ones trained
(`grpo_stream.envs.replay`), never the generator's. Without it, its episodes' rewards are the
generator's word (the hub logs `env.rewards_trusted` when it starts).

Invariants the sandbox checks on every call (a violation fails the episode, NaN reward):
`step` returns a `Step` whose `observation` is a str, `reward` a finite real number and
`done` a bool; a call that raises, exceeds the timeout or the memory limit fails the
episode. The episode's outcome reward is the sum of its per-turn rewards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Step:
    """The environment's answer to one policy turn."""

    observation: str = ""
    """Text appended to the conversation as the environment's turn (ignored when done)."""
    reward: float = 0.0
    """This turn's reward; the episode's outcome reward is the sum over its turns."""
    done: bool = False
    """True ends the episode after this turn."""


@runtime_checkable
class Environment(Protocol):
    """One episode's environment (a fresh instance per episode)."""

    def reset(self, prompt: str, reference: dict[str, Any]) -> None:
        """Start the episode of the task problem (`prompt`, `reference`)."""
        ...

    def step(self, action: str) -> Step:
        """Answer the policy's reply `action` (its decoded text, special tokens removed)."""
        ...
