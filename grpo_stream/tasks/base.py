"""What a task is: a deterministic, indexable stream of verifiable problems.

Invariants: `problem(i)` depends only on the task's settings (seed included) and `i`, so the
hub's dataset cursor is one integer it checkpoints, and a resumed run sees exactly the prompts
it would have seen; a `Problem.reference` holds only msgpack-native values (str, int, float,
bool, list, dict) so it travels to scorers as is.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from grpo_stream.config.tasks import RewardSpec


@dataclass(frozen=True)
class Problem:
    """One prompt and what its verifiers need to score a completion."""

    index: int
    prompt: str
    reference: dict[str, Any]
    family: str | None = None
    """The problem's family as the dataset names it (task.family_field), else None."""


@runtime_checkable
class Task(Protocol):
    """A stream of problems and the rewards that verify them."""

    @property
    def name(self) -> str:
        """The task's name, as in task.name."""
        ...

    @property
    def size(self) -> int | None:
        """Distinct problems before the stream repeats; None for an endless generated stream."""
        ...

    def problem(self, index: int) -> Problem:
        """The problem at `index` (any index >= 0; finite tasks wrap around by epoch)."""
        ...

    def default_rewards(self) -> list[RewardSpec]:
        """The rewards used when the run config names none."""
        ...


def problem_rng(task: str, seed: int, index: int) -> random.Random:
    """A generator for one problem, independent of every other index.

    String seeds are hashed with SHA-512 by `random`, so this is stable across processes and
    Python runs (unlike `hash()`).
    """
    if index < 0:
        raise ValueError(f"problem index must be >= 0, got {index}")
    return random.Random(f"{task}:{seed}:{index}")


def chat_prompt(tokenizer: Any, text: str) -> str:
    """`text` as a user turn in the tokenizer's chat template, ready for the assistant's reply."""
    if tokenizer is None:
        raise ValueError("task.chat_template = true needs the model's tokenizer")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("task.chat_template = true but the tokenizer has no chat template")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return str(prompt)
