"""The reward calls of one group, as the pool schedules them: each distinct completion once.

Invariants:
- A group's calls are (component, distinct text) pairs: a completion that repeats within the
  group is scored once per component and its verdict given to every copy (the cache lives
  in one group: one reference, one request; it never outlives `GroupCalls`).
- Every call ends exactly once, with a finite value or a failure; the group is done when
  every call ended. A failed call makes NaN of its component's value for each copy of its
  text and one error line per copy, "name[index]: cause" (component, then index order).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Call = tuple[int, int]
"""(component, distinct text index) of one reward call."""


@dataclass(frozen=True)
class ScoreResult:
    """Rewards of the G completions of one prompt."""

    rewards: npt.NDArray[np.float32]  # (G,) weighted sum; NaN where any component failed
    component_names: list[str]
    components: npt.NDArray[np.float32]  # (C, G) NaN where that call failed
    errors: list[str]  # one line per failed call and copy: "name[index]: cause"


@dataclass
class Chunk:
    """Calls of one group sent to one worker in one message, run in this order."""

    group: int
    calls: list[Call]
    alone: bool = False  # a retried call on its own: whatever ends it is its own doing


class GroupCalls:
    """One group's completions, its distinct texts, and the values of its calls."""

    def __init__(
        self, prompt: str, completions: list[str], reference: bytes, n_components: int
    ) -> None:
        self.prompt = prompt
        self.reference = reference  # msgpack of the task's reference, packed once
        self.texts: list[str] = []  # distinct completions, in first-seen order
        self.copies: list[list[int]] = []  # completion indices of each distinct text
        index_of: dict[str, int] = {}
        for i, text in enumerate(completions):
            if text not in index_of:
                index_of[text] = len(self.texts)
                self.texts.append(text)
                self.copies.append([])
            self.copies[index_of[text]].append(i)
        self.values = np.full((n_components, len(completions)), np.nan, dtype=np.float32)
        self._errors: list[tuple[int, int, str]] = []  # (component, completion, line)
        self.open = n_components * len(self.texts)
        self._ended: set[Call] = set()

    def calls(self) -> list[Call]:
        """Every call of the group, component by component (a batch reward's run together)."""
        return [(c, u) for c in range(self.values.shape[0]) for u in range(len(self.texts))]

    def chunks(self, group: int, pieces: int) -> list[Chunk]:
        """The group's calls cut into at most `pieces` contiguous chunks (at least one call
        each; one when `pieces` is 1: the whole group is one worker call)."""
        calls = self.calls()
        n = max(1, min(pieces, len(calls)))
        bounds = np.linspace(0, len(calls), n + 1).round().astype(int)
        return [Chunk(group, calls[a:b]) for a, b in itertools.pairwise(bounds)]

    def put(self, call: Call, value: float) -> None:
        """A call's finite value, for every copy of its text."""
        if not math.isfinite(value):
            raise ValueError(f"reward value {value} is not finite")
        self._end(call)
        component, u = call
        self.values[component, self.copies[u]] = value

    def fail(self, call: Call, name: str, cause: str) -> None:
        """A call failed: NaN stays, one error line per copy of its text."""
        self._end(call)
        component, u = call
        self._errors.extend((component, i, f"{name}[{i}]: {cause}") for i in self.copies[u])

    def _end(self, call: Call) -> None:
        if call in self._ended:
            raise ValueError(f"reward call {call} ended twice")
        self._ended.add(call)
        self.open -= 1

    def result(self, names: list[str], weights: npt.NDArray[np.float32]) -> ScoreResult:
        """The group's rewards: sum of weight * value over components (NaN propagates)."""
        rewards = (weights[:, None] * self.values).sum(axis=0)  # (G,)
        return ScoreResult(
            rewards=rewards.astype(np.float32),
            component_names=list(names),
            components=self.values,
            errors=[line for _, _, line in sorted(self._errors)],
        )
