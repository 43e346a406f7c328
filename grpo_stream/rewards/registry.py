"""Reward lookup: built-in names, user functions and learned reward models, with params bound.

A spec is a built-in (`name = "exact_match"`, ...), a user function (`name = "python"` with
`import = "pkg.module:fn"`, or the short form `name = "pkg.module:fn"`), a reward model
(`name = "reward_model"` with `path`; its params configure the model, see reward_model.py),
or a generative judge (`name = "judge"` with `path`, see judge.py).
A user function has the signature

    def fn(completion: str, *, prompt: str, reference: dict[str, Any], **params) -> float

where `reference` is the task's reference for the prompt (e.g. {"answer": "42"}) and `params`
are the spec's params; it runs in a reward worker process, may be called many times per
second, and must return a finite number.

Invariants: a RewardSpec that loads is callable as `fn(completion, prompt=..., reference=...)`
— its params are checked against the function's signature at load time, so a typo in a
config fails when the scorer starts, not on the first completion; nothing is imported from a
user path but the named module.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

from grpo_stream.config.tasks import RewardSpec, TaskSettings
from grpo_stream.rewards import gym
from grpo_stream.rewards.builtin import (
    exact_match,
    format_reward,
    length_penalty,
    load_math_verify,
)
from grpo_stream.rewards.builtin import math_verify_reward as math_verify
from grpo_stream.rewards.countdown import countdown
from grpo_stream.rewards.errors import RewardLoadError
from grpo_stream.rewards.judge import Judge
from grpo_stream.rewards.reward_model import RewardModel
from grpo_stream.tasks.base import Task
from grpo_stream.usercode import UserCodeError, import_object

RewardFn = Callable[..., float]
"""Called as fn(completion, prompt=..., reference=...) -> float."""

BUILTIN: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "math_verify": math_verify,
    "format": format_reward,
    "length_penalty": length_penalty,
    "countdown": countdown,
    "reasoning_gym": gym.reasoning_gym_reward,
}
PRELOAD: dict[str, Callable[[], RewardFn]] = {
    "reasoning_gym": gym.load,
    "math_verify": load_math_verify,
}
"""Built-ins whose heavy imports are done when they load, not on their first call."""


def _import_user(path: str) -> RewardFn:
    try:
        fn = import_object(path, f"reward {path!r}")
    except UserCodeError as exc:
        raise RewardLoadError(str(exc)) from None
    if not callable(fn):
        raise RewardLoadError(f"reward {path!r}: {path.partition(':')[2]} is not callable")
    return fn  # type: ignore[no-any-return]


def _check_params(name: str, fn: RewardFn, params: dict[str, Any]) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C function without a signature: the first call will tell
    try:
        signature.bind("", prompt="", reference={}, **params)
    except TypeError as exc:
        raise RewardLoadError(
            f"reward {name!r} with params {sorted(params)}: {exc} "
            "(a reward is fn(completion, *, prompt, reference, **params))"
        ) from None


def load_reward(spec: RewardSpec) -> RewardFn:
    """The reward `spec` names, with its params bound (functools.partial)."""
    if spec.name == "reward_model" and spec.path is not None:
        try:
            return RewardModel.load(spec.path, **spec.params)  # type: ignore[arg-type]
        except TypeError as exc:
            raise RewardLoadError(f"reward_model {spec.path}: params: {exc}") from None
    if spec.name == "judge" and spec.path is not None:
        try:  # its Unparsed verdicts become NaN in the sandbox (sandbox_worker._call_batch)
            return cast(RewardFn, Judge.load(spec.path, **spec.params))  # type: ignore[arg-type]
        except TypeError as exc:
            raise RewardLoadError(f"judge {spec.path}: params: {exc}") from None
    if spec.name == "python" and spec.import_ is not None:
        fn = _import_user(spec.import_)
    elif spec.name in PRELOAD:
        fn = PRELOAD[spec.name]()
    elif spec.name in BUILTIN:
        fn = BUILTIN[spec.name]
    elif ":" in spec.name:
        fn = _import_user(spec.name)
    else:
        raise RewardLoadError(
            f"unknown reward {spec.name!r}: built-ins are {', '.join(BUILTIN)}; user rewards "
            "are name = 'python' with import = 'package.module:function'; learned ones are "
            "name = 'reward_model' or 'judge' with path = '...'"
        )
    _check_params(spec.import_ or spec.name, fn, dict(spec.params))
    return functools.partial(fn, **spec.params)


def reward_specs(settings: TaskSettings, task: Task) -> list[RewardSpec]:
    """The run's rewards: task.rewards from the config, else the task's defaults."""
    return list(settings.rewards) if settings.rewards is not None else task.default_rewards()


def combine(values: Sequence[float], specs: Sequence[RewardSpec]) -> float:
    """The scalar reward: sum of weight * value (NaN if any component is NaN)."""
    if len(values) != len(specs):
        raise ValueError(f"{len(values)} reward values for {len(specs)} specs")
    return math.fsum(spec.weight * value for value, spec in zip(values, specs, strict=True))
