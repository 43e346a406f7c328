"""Small verifiers 0.4 environments written the way verifiers' own docs write them (a
taskset, a task with @vf.reward / @vf.stop hooks, an Env whose run() drives an
interaction), for the adapter's tests. Importable by the sandbox's workers (sys.path), and
by verifiers' own loader as taskset id `vf_guess`.

`load_environment`: guess a hidden number in 1..16; the env answers `higher A-B:` /
`lower A-B:` (the tiny-guess model's feedback format), run() stops when the guess is right;
the task's reward is 1 when found.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    info: dict
    """The hidden number."""


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def found(self, trace: vf.Trace) -> float:
        return float(trace.info.get("found", False))

    @vf.stop
    async def too_many(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= int(self.data.info.get("stop_after", 99))


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    INFINITE = True

    def load(self) -> Iterator[GuessTask]:
        for i in itertools.count():
            target = random.Random(f"vf-guess:{i}").randint(1, 16)
            data = GuessData(prompt="guess 1-16:", info={"target": target})
            yield GuessTask(data, self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


def feedback(reply: str, target: int, low: int, high: int) -> tuple[str, int, int]:
    """`higher A-B:` / `lower A-B:` for a guess, with the narrowed range."""
    digits = re.findall(r"\d+", reply)
    guess = int(digits[0]) if digits else 0
    if guess < target:
        low = max(low, guess + 1)
        return f"higher {low}-{high}:", low, high
    high = min(high, guess - 1)
    return f"lower {low}-{high}:", low, high


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        target, low, high = task.data.info["target"], 1, 16
        async with agents.player.interaction(task) as it:
            segment = await it.turn()
            while not segment.terminated:
                if re.findall(r"\d+", segment.last_reply)[:1] == [str(target)]:
                    it.trace.info["found"] = True
                    break
                if task.data.info.get("raise_at") == it.trace.num_turns:
                    raise RuntimeError("vf env broke")
                text, low, high = feedback(segment.last_reply, target, low, high)
                segment = await it.turn(text)
        it.trace.record_reward("turns", -0.01 * it.trace.num_turns)


class Scripted(vf.Env[GuessEnvConfig]):
    """Answers `t1:`, `t2:` ... and stops after 3 policy turns (for exact checks)."""

    async def run(self, task, agents):
        async with agents.player.interaction(task) as it:
            segment = await it.turn()
            for k in range(1, 3):
                segment = await it.turn(f"t{k}:")
        it.trace.record_reward("done", 1.0 if not segment.terminated else 0.5)


__all__ = ["GuessEnv", "GuessTaskset"]


def load_environment() -> vf.Env:
    return GuessEnv(GuessEnvConfig(taskset={"id": "vf_guess"}))


def load_scripted() -> vf.Env:
    return Scripted(GuessEnvConfig(taskset={"id": "vf_guess"}))


def load_two_seats() -> vf.Env:
    class TwoSeats(GuessEnvConfig):
        judge: vf.AgentConfig = vf.AgentConfig()

    class Env2(vf.Env[TwoSeats]):
        async def run(self, task, agents):
            return None

    return Env2(TwoSeats(taskset={"id": "vf_guess"}))


def load_broken() -> vf.Env:
    raise OSError("no such dataset")
