"""Environments that misbehave at a chosen turn, whatever the policy says (so tests do not
depend on what a sampled reply is). Importable by the sandbox's workers (sys.path)."""

from __future__ import annotations

import os
import time
from typing import Any

from grpo_stream.envs.base import Step


class _Turns:
    bad_turn = 2

    def reset(self, prompt: str, reference: dict[str, Any]) -> None:
        self.turn = 0
        self.bad = bool(reference.get("bad", True))

    def step(self, action: str) -> Step:
        self.turn += 1
        if self.bad and self.turn == self.bad_turn:
            return self.misbehave()
        return Step("ok:", 0.25, self.turn >= 3)

    def misbehave(self) -> Step:
        raise NotImplementedError


class Raises(_Turns):
    def misbehave(self) -> Step:
        raise ValueError("bad env")


class Hangs(_Turns):
    def misbehave(self) -> Step:
        time.sleep(60)
        return Step()


class NonText(_Turns):
    def misbehave(self) -> Step:
        return Step(observation=42)  # type: ignore[arg-type]


class NotAStep(_Turns):
    def misbehave(self) -> Any:
        return {"observation": "x", "reward": 1.0, "done": False}


class Exits(_Turns):
    def misbehave(self) -> Step:
        os._exit(3)


class Endless:
    """Never done: every episode runs into env.max_turns."""

    def reset(self, prompt: str, reference: dict[str, Any]) -> None:
        pass

    def step(self, action: str) -> Step:
        return Step("again:", 0.5, False)


class Chatty:
    """Answers the first turn with an observation far over any token budget."""

    def reset(self, prompt: str, reference: dict[str, Any]) -> None:
        pass

    def step(self, action: str) -> Step:
        return Step("x" * 500, 0.5, False)


class ThreeTurns:
    """Exactly three policy turns, rewarded 0.1, 0.2, 1.0."""

    def reset(self, prompt: str, reference: dict[str, Any]) -> None:
        self.turn = 0

    def step(self, action: str) -> Step:
        self.turn += 1
        return Step(f"t{self.turn}:", [0.1, 0.2, 1.0][self.turn - 1], self.turn == 3)
