"""Environments called in this process, without a sandbox: for trusted built-in
environments at build time (the tiny-model builders measure success with them). The
services always use `grpo_stream.envs.sandbox.EnvPool`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpo_stream.envs.base import Environment, Step
from grpo_stream.envs.sandbox import Answer
from grpo_stream.envs.worker import check_step
from grpo_stream.ratelimit import RateLimit


class LocalEnvs:
    """The EnvPool calls (`grpo_stream.envs.episodes.EnvCalls`), answered in process."""

    def __init__(self, factory: Callable[[], Environment]) -> None:
        self.factory = factory
        self.envs: dict[int, Environment] = {}
        self.warn = RateLimit()

    def reset(self, episodes: dict[int, tuple[str, dict[str, Any]]]) -> dict[int, Answer]:
        for key, (prompt, reference) in episodes.items():
            self.envs[key] = self.factory()
            self.envs[key].reset(prompt, reference)
        return {key: Answer(Step()) for key in episodes}

    def step(self, actions: dict[int, str]) -> dict[int, Answer]:
        out = {}
        for key, action in actions.items():
            result = self.envs[key].step(action)
            bad = check_step(result)
            out[key] = Answer(None, bad) if bad is not None else Answer(result)
        return out

    def drop(self, keys: list[int]) -> None:
        for key in keys:
            self.envs.pop(key, None)
