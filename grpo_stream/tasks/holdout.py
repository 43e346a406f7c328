"""Held-out prompts: a task split by a hash of the prompt text into training and evaluation.

Invariants: a prompt is held out when the first 8 bytes of SHA-256(prompt) as an integer,
modulo 2**20, fall below `fraction * 2**20`, so the split depends only on the text, in every
process; the training view never yields a held-out prompt and the evaluation view yields only
held-out prompts, so the two never overlap; both views keep `problem(i)` a pure function of i.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Literal

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.tasks.base import Problem, Task
from grpo_stream.tasks.dataset import TaskDataError

_BUCKETS = 1 << 20
_TRIES = 256
"""Training: underlying problems tried for one index before giving up (p = fraction**256)."""
_ENDLESS_STRIDE = 1 << 40
"""Training on an endless task: retry at i + t * stride, far from every other index."""
_EVAL_SCAN = 1 << 20
"""Evaluation: underlying problems scanned at most for held-out ones."""


def held_out(prompt: str, fraction: float) -> bool:
    """Whether `prompt` belongs to the evaluation part."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % _BUCKETS < fraction * _BUCKETS


@dataclass
class HeldOut:
    """One part (train or eval) of `task`."""

    task: Task
    fraction: float
    part: Literal["train", "eval"]
    _eval_indices: list[int] = field(default_factory=list)
    _scanned: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.fraction < 1:
            raise ValueError(f"task.holdout must be in (0, 1), got {self.fraction}")

    @property
    def name(self) -> str:
        return f"{self.task.name}[{self.part}]"

    @property
    def size(self) -> int | None:
        return self.task.size

    def default_rewards(self) -> list[RewardSpec]:
        return self.task.default_rewards()

    def problem(self, index: int) -> Problem:
        if index < 0:
            raise ValueError(f"problem index must be >= 0, got {index}")
        if self.part == "train":
            return self._train(index)
        return self._eval(index)

    def _train(self, index: int) -> Problem:
        stride = self.task.size or _ENDLESS_STRIDE  # a finite task: the same slot, a later epoch
        for t in range(_TRIES):
            problem = self.task.problem(index + t * stride)
            if not held_out(problem.prompt, self.fraction):
                return replace(problem, index=index)
        raise TaskDataError(f"task.holdout {self.fraction}: problem {index} is always held out")

    def _eval(self, index: int) -> Problem:
        limit = min(self.task.size or _EVAL_SCAN, _EVAL_SCAN)
        while len(self._eval_indices) <= index and self._scanned < limit:
            if held_out(self.task.problem(self._scanned).prompt, self.fraction):
                self._eval_indices.append(self._scanned)
            self._scanned += 1
        if not self._eval_indices:
            raise TaskDataError(
                f"task.holdout {self.fraction}: none of the first {limit} problems is held out"
            )
        problem = self.task.problem(self._eval_indices[index % len(self._eval_indices)])
        return replace(problem, index=index)
