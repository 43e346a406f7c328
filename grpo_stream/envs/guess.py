"""`guess`: find a hidden number in 1..N from "higher"/"lower" feedback.

The task's prompt is `guess 1-N:`; each policy turn is a number; the environment answers
`higher LO-HI:` or `lower LO-HI:` (the range the feedback still allows) or `invalid LO-HI:`
for a reply that is not a number. Rewards, per turn t:

- `shaping` when the guess lies inside the range still allowed (a guess that uses the
  feedback), 0 otherwise: the per-turn signal that `algo.returns = "per_turn"` credits;
- 1 more on the turn that finds the number, if it is within the first `turns` guesses.

The episode ends when the number is found or after `turns` guesses. The outcome reward is
the sum: 1 + shaping x (guesses in range) for a success, shaping x (guesses in range) else.
Binary search (the midpoint of the range) finds any number of 1..16 within 5 guesses and
15 of 16 within 4.
"""

from __future__ import annotations

from typing import Any

from grpo_stream.envs.base import Step


class GuessEnv:
    """One game of guess-the-number."""

    replayable = True
    """Observations and rewards are a function of the prompt, the reference and the
    actions: a scorer recomputes its episodes (`grpo_stream.envs.replay`)."""

    def __init__(self, turns: int = 4, shaping: float = 0.1) -> None:
        self.turns = turns
        self.shaping = shaping
        self.target = self.low = self.high = self.turn = 0

    def reset(self, prompt: str, reference: dict[str, Any]) -> None:
        self.target = int(reference["target"])
        self.low, self.high = 1, int(reference["high"])
        self.turn = 0

    def step(self, action: str) -> Step:
        self.turn += 1
        guess = parse_number(action)
        last = self.turn >= self.turns
        if guess is None:
            return Step(f"invalid {self.low}-{self.high}:", 0.0, last)
        reward = self.shaping if self.low <= guess <= self.high else 0.0
        if guess == self.target:
            return Step("", reward + 1.0, True)
        if guess < self.target:
            self.low = max(self.low, guess + 1)
            word = "higher"
        else:
            self.high = min(self.high, guess - 1)
            word = "lower"
        return Step(f"{word} {self.low}-{self.high}:", reward, last)


def parse_number(text: str) -> int | None:
    """The integer `text` spells (surrounding whitespace allowed), or None."""
    text = text.strip()
    body = text[1:] if text[:1] == "-" else text
    if not (body.isascii() and body.isdigit()) or len(body) > 9:
        return None
    return int(text)
