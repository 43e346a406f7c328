"""An environment for the vLLM episode tests (imported by the sandbox's worker processes)."""

from __future__ import annotations

from typing import Any

from grpo_stream.envs.base import Step

REWARDS = (0.1, 0.2, 1.0)


def observation(turn: int) -> str:
    return f"no, turn {turn} of 3:"


class ThreeTurns:
    """Exactly three policy turns whatever the policy says, rewarded 0.1, 0.2, 1.0."""

    def reset(self, prompt: str, reference: dict[str, Any]) -> None:
        self.turn = 0

    def step(self, action: str) -> Step:
        self.turn += 1
        return Step(observation(self.turn), REWARDS[self.turn - 1], self.turn == 3)
