"""guess: the problems of the `guess` environment (grpo_stream.envs.guess).

Invariants: the hidden number is drawn uniformly from 1..guess_max; the prompt is exactly
`f"guess 1-{guess_max}:"` (what the tiny-guess model was warm-started on) and the reference
holds the number and the range, which only the environment reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.tasks.base import Problem, problem_rng


@dataclass(frozen=True)
class GuessTask:
    """An endless stream of hidden numbers."""

    seed: int = 0
    high: int = 16
    name: str = "guess"
    size: int | None = None

    def problem(self, index: int) -> Problem:
        target = problem_rng(self.name, self.seed, index).randint(1, self.high)
        return Problem(
            index=index,
            prompt=f"guess 1-{self.high}:",
            reference={"target": target, "high": self.high},
        )

    def default_rewards(self) -> list[RewardSpec]:
        """Episodes are rewarded by their environment; this spec only lets a scorer start
        (the hub sends it no episode group)."""
        return [RewardSpec(name="exact_match", weight=1.0)]
