"""reasoning_gym: the scorer reasoning-gym ships with each of its datasets, as a reward.

The reference carries the generated entry (task `reasoning_gym:<dataset>`); the dataset's own
`score_answer(answer, entry)` gives the reward in [0, 1]. The completion is stripped of
surrounding whitespace first; reasoning-gym's scorers parse the answer themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any


def load() -> Callable[..., float]:
    """The reward, with reasoning-gym imported now: a worker loads it before it serves, so
    the import (seconds) never counts against a call's timeout."""
    import reasoning_gym  # noqa: F401

    return reasoning_gym_reward


@lru_cache(maxsize=32)
def _scorer(dataset: str) -> Callable[[str, dict[str, Any]], float]:
    import reasoning_gym

    fn: Callable[[str, dict[str, Any]], float] = reasoning_gym.get_score_answer_fn(dataset)
    return fn


def reasoning_gym_reward(completion: str, *, prompt: str, reference: dict[str, Any]) -> float:
    """reasoning-gym's score of the completion for the entry in reference['entry']."""
    entry = reference.get("entry") if isinstance(reference, dict) else None
    if not isinstance(entry, dict) or "metadata" not in entry:
        raise ValueError("the reasoning_gym reward needs a reasoning_gym:<dataset> task")
    dataset = entry["metadata"].get("source_dataset")
    if not isinstance(dataset, str):
        raise ValueError("reference['entry']['metadata'] has no source_dataset")
    return float(_scorer(dataset)(completion.strip(), entry))
