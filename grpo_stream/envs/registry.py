"""Environment lookup: built-in names and user classes, built with their settings."""

from __future__ import annotations

from collections.abc import Callable

from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.base import Environment
from grpo_stream.envs.calc import CalcEnv
from grpo_stream.envs.guess import GuessEnv
from grpo_stream.usercode import UserCodeError, import_object


class EnvLoadError(RuntimeError):
    """The configured environment cannot be built (one line naming env.name)."""


def replayable(settings: EnvSettings) -> bool:
    """Whether a scorer can recompute this run's episodes (`grpo_stream.envs.replay`): the
    environment's class says `replayable = True` (built-ins do); an agent never can."""
    if not settings.enabled or settings.agent is not None:
        return False
    return bool(getattr(_env_class(settings), "replayable", False))


def generator_rewards(settings: EnvSettings) -> bool:
    """Whether this run's rewards are its generators' word: episodes no scorer can replay
    (no scorer is started for them)."""
    return settings.enabled and not replayable(settings)


def _env_class(settings: EnvSettings) -> object:
    if settings.name == "guess":
        return GuessEnv
    if settings.name == "calc":
        return CalcEnv
    try:
        return import_object(settings.name, f"env.name = {settings.name!r} does not load")
    except UserCodeError as exc:
        raise EnvLoadError(str(exc)) from None


def env_factory(settings: EnvSettings) -> Callable[[], Environment]:
    """A function building one fresh environment per episode."""
    if settings.name == "guess":
        return lambda: GuessEnv(turns=settings.guess_turns, shaping=settings.guess_shaping)
    if settings.name == "calc":
        return lambda: CalcEnv(turns=settings.max_turns)
    if settings.name == "none":
        raise EnvLoadError("env.name = 'none': this run has no environment")
    try:
        cls = import_object(settings.name, f"env.name = {settings.name!r} does not load")
    except UserCodeError as exc:
        raise EnvLoadError(str(exc)) from None
    if not callable(cls):
        raise EnvLoadError(f"env.name = {settings.name!r} is not a class")

    def build() -> Environment:
        env = cls()
        if not isinstance(env, Environment):
            raise TypeError(f"{settings.name} has no reset/step methods")
        return env

    return build
