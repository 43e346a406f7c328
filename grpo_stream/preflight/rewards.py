"""Pre-flight's call of every reward: each built-in and user reward function of a run is called
once on a sample completion of the task's first problem, before any service starts: the
built-ins here (our code), user functions in the scorer's sandbox (a worker process,
`scorer.timeout_s`, `scorer.memory_limit_mb`).

A reward that raises, hangs, dies or returns a non-number there would fail every completion
of the run (it used to start, then abort after `run.abort_after_failed_groups` failed groups
with only "raised KeyError: 'product'"): it is refused with one line naming the reward, the
cause and the user's file:line (the sandbox's events are not shown: that line is what
`up` prints).

The sample completion is the problem's reference answer where it has one (what a reward must
be able to score), else the empty completion. Learned rewards (`reward_model`, `judge`) are
not called: they load a model, and pre-flight checks their configuration instead. A user
reward costs a worker's start (about a second: the fork server, the rewards' imports); the
built-ins cost their call (math_verify: its import of sympy).
"""

from __future__ import annotations

import math
import numbers

import structlog

from grpo_stream.config.run import ScorerSettings
from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards import BUILTIN, load_reward
from grpo_stream.rewards.failures import describe
from grpo_stream.rewards.sandbox import RewardPool, RewardPoolError
from grpo_stream.rewards.sizing import LEARNED
from grpo_stream.tasks.base import Problem


class RewardCallError(ValueError):
    """A reward fails on the task's sample completion; the message is one line."""


def sample_completion(problem: Problem) -> str:
    """A completion a reward must be able to score: the reference answer, else empty."""
    answer = problem.reference.get("answer")
    return "" if answer is None else str(answer)


def check_reward_calls(
    task_name: str, problem: Problem, specs: list[RewardSpec], scorer: ScorerSettings
) -> None:
    """Call every reward of `specs` but the learned ones once on `problem`'s sample
    completion; raise RewardCallError naming the first that fails."""
    sample = sample_completion(problem)
    builtin = [spec for spec in specs if spec.name in BUILTIN]
    user = [spec for spec in specs if spec.name not in BUILTIN and spec.name not in LEARNED]
    failed = _call_builtins(builtin, problem, sample) or _call_sandboxed(
        user, problem, sample, scorer
    )
    if failed is None:
        return
    name, cause = failed
    keys = ", ".join(sorted(problem.reference)) or "none"
    raise RewardCallError(
        f"reward {name!r} cannot score task {task_name!r}: {cause}, called on the sample "
        f"completion {sample!r} (its problems' reference has the keys: {keys}; a multi-turn "
        "task needs its env.name)"
    )


def _call_builtins(
    specs: list[RewardSpec], problem: Problem, sample: str
) -> tuple[str, str] | None:
    """Built-ins run here (our code: no sandbox to start); (name, cause) of the first that
    fails."""
    for spec in specs:
        try:
            value = load_reward(spec)(sample, prompt=problem.prompt, reference=problem.reference)
        except Exception as exc:  # a built-in that cannot score this task's problems
            return spec.name, describe(exc).cause
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            return spec.name, f"returned {value!r}, not a finite number"
    return None


def _call_sandboxed(
    specs: list[RewardSpec], problem: Problem, sample: str, scorer: ScorerSettings
) -> tuple[str, str] | None:
    """User rewards run in the scorer's sandbox; (name, cause) of the first that fails."""
    if not specs:
        return None
    quiet = structlog.wrap_logger(structlog.ReturnLogger())  # the one line says it all
    try:
        with RewardPool(specs, 1, scorer.timeout_s, scorer.memory_limit_mb, quiet) as pool:
            result = pool.score(problem.prompt, [sample], dict(problem.reference))
    except RewardPoolError as exc:
        return ", ".join(spec.name for spec in specs), str(exc).splitlines()[0]
    if not result.errors:
        return None
    name, _, cause = result.errors[0].partition("[0]: ")
    return name, cause
