"""Environment lookup: built-in names and user classes, built with their settings."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from grpo_stream.envs.base import Environment
from grpo_stream.envs.settings import EnvSettings


class EnvLoadError(RuntimeError):
    """The configured environment cannot be built (one line naming env.name)."""


def env_factory(settings: EnvSettings) -> Callable[[], Environment]:
    """A function building one fresh environment per episode."""
    if settings.name == "guess":
        from grpo_stream.envs.guess import GuessEnv

        return lambda: GuessEnv(turns=settings.guess_turns, shaping=settings.guess_shaping)
    if settings.name == "calc":
        from grpo_stream.envs.calc import CalcEnv

        return lambda: CalcEnv(turns=settings.max_turns)
    if settings.name == "none":
        raise EnvLoadError("env.name = 'none': this run has no environment")
    module_name, _, attr = settings.name.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise EnvLoadError(f"env.name = {settings.name!r} does not load: {exc}") from None
    if not callable(cls):
        raise EnvLoadError(f"env.name = {settings.name!r} is not a class")

    def build() -> Environment:
        env = cls()
        if not isinstance(env, Environment):
            raise TypeError(f"{settings.name} has no reset/step methods")
        return env

    return build
