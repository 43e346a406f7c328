"""Which prompts the hub lets out: the prompt source of dispatch, and the curriculum from pass
rates.

Group ids are dataset indices (`grpo_stream.tasks`: `problem(i)` is a pure function of the
settings and i). The ledger asks its prompt source for the next index at or after its cursor
(`Ledger.take_for_generation`, the one place a new prompt enters the pipeline); the source
hears each scored group's rewards (`observe`, from the hub's intake). `Stream` takes every
index in order. `Curriculum` (hub.curriculum.enabled) passes over indices whose prompt is
expected to give a group without signal:

- it keeps, per key (the problem's `family` when task.family_field names one, else a digest
  of its prompt: a prompt seen again), the recent pass rate p: the share of a group's
  completions whose reward is at least `pass_reward`, averaged over the key's first `window`
  groups, then an exponential moving average with weight 1 / window;
- a group of G completions carries signal unless all pass or none does: s(p) = 1 - p^G -
  (1 - p)^G, largest at p = 1/2. The source lets index i out with probability
  a = max(floor, s(p) / s(1/2)) (1 for a key it has not seen: new prompts are explored), so
  the prompts let out are distributed as the stream weighted by a, with every prompt's
  chance at least `floor`: none starves, and a prompt that was too easy or too hard is
  measured again now and then;
- the draw for index i is a hash of (run.seed, i): deterministic, no generator state to
  checkpoint.

Invariants: indices are taken in increasing order, each at most once (the ledger's cursor
moves past the ones passed over); a draw passes over at most `SKIP_LIMIT` indices; the pass
rates are bounded by `max_keys` (least recently seen forgotten first) and are checkpointed with
the ledger, so a restarted hub keeps its curriculum. After a crash restored from the journal
the indices passed over since the last checkpoint are generated after all (the ledger re-queues
every index below the last one sent); they are counted as dispatched, so the accounting holds.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Protocol

import numpy as np

from grpo_stream.config.curriculum import CurriculumSettings
from grpo_stream.tasks.base import Problem, Task

SKIP_LIMIT = 1000
"""The most indices one draw passes over (floor >= 0.01 makes 100 the expected worst)."""


class PromptSource(Protocol):
    """Where the ledger's new group ids (dataset indices) come from."""

    def next_index(self, cursor: int) -> int:
        """The next index to dispatch, at or after `cursor` (the ledger's next index)."""
        ...

    def observe(self, group_id: int, rewards: np.ndarray) -> None:
        """A scored group's rewards (G,), NaN where a reward failed."""
        ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...


class Stream:
    """Every index in order (no curriculum)."""

    def next_index(self, cursor: int) -> int:
        return cursor

    def observe(self, group_id: int, rewards: np.ndarray) -> None:
        return None

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        return None


def expected_signal(p: float, group_size: int) -> float:
    """The chance that G completions of pass rate p neither all pass nor all fail."""
    return 1.0 - p**group_size - (1.0 - p) ** group_size


def problem_key(problem: Problem) -> str:
    """What a pass rate is kept for: the problem's family, else its prompt (a digest)."""
    if problem.family is not None:
        return f"family:{problem.family}"
    return hashlib.blake2b(problem.prompt.encode(), digest_size=12).hexdigest()


def draw(seed: int, index: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, index)."""
    digest = hashlib.blake2b(f"curriculum:{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


class Curriculum:
    """Pass rates per key and the draw that lets prompts out (see the module doc)."""

    def __init__(
        self, settings: CurriculumSettings, task: Task, group_size: int, seed: int
    ) -> None:
        self.settings = settings
        self.task = task
        self.group_size = group_size
        self.seed = seed
        self.best = expected_signal(0.5, group_size)
        self.rates: OrderedDict[str, tuple[float, int]] = OrderedDict()
        """key -> (pass rate, groups averaged up to window), least recently seen first."""

    def accept_probability(self, key: str) -> float:
        """a = max(floor, s(p) / s(1/2)); 1 for a key not seen yet."""
        seen = self.rates.get(key)
        if seen is None or self.best <= 0:
            return 1.0
        share = expected_signal(seen[0], self.group_size) / self.best
        return max(self.settings.floor, min(1.0, share))

    def next_index(self, cursor: int) -> int:
        index = cursor
        while index - cursor < SKIP_LIMIT:
            u = draw(self.seed, index)
            if u < self.settings.floor:  # let out whatever its key: no lookup needed
                return index
            if u < self.accept_probability(problem_key(self.task.problem(index))):
                return index
            index += 1
        return index

    def observe(self, group_id: int, rewards: np.ndarray) -> None:
        finite = rewards[np.isfinite(rewards)]
        if finite.size == 0:
            return  # every reward failed: nothing learned about the prompt
        passed = float(np.mean(finite >= self.settings.pass_reward))
        key = problem_key(self.task.problem(group_id))
        rate, seen = self.rates.pop(key, (0.0, 0))
        seen = min(seen + 1, self.settings.window)
        self.rates[key] = (rate + (passed - rate) / seen, seen)  # most recently seen: last
        while len(self.rates) > self.settings.max_keys:
            self.rates.popitem(last=False)

    def pass_rate(self, key: str) -> float | None:
        """The key's recent pass rate, None before its first group."""
        seen = self.rates.get(key)
        return None if seen is None else seen[0]

    def state(self) -> dict[str, Any]:
        return {"rates": [[key, rate, seen] for key, (rate, seen) in self.rates.items()]}

    def load_state(self, state: dict[str, Any]) -> None:
        self.rates = OrderedDict(
            (str(key), (float(rate), int(seen))) for key, rate, seen in state["rates"]
        )


def make_source(
    settings: CurriculumSettings, task: Task, group_size: int, seed: int
) -> PromptSource:
    """The hub's prompt source: the curriculum when enabled, else the plain stream."""
    if settings.enabled:
        return Curriculum(settings, task, group_size, seed)
    return Stream()
