"""Pre-flight's call of every reward: each built-in and user reward function of a run is called
once, in the scorer's sandbox (a worker process, `scorer.timeout_s`, `scorer.memory_limit_mb`),
on a sample completion of the task's first problem, before any service starts.

A reward that raises, hangs, dies or returns a non-number there would fail every completion
of the run (it used to start, then abort after `run.abort_after_failed_groups` failed groups
with only "raised KeyError: 'product'"): it is refused with one line naming the reward, the
cause and the user's file:line (the sandbox's events are not shown: that line is what
`up` prints).

The sample completion is the problem's reference answer where it has one (what a reward must
be able to score), else the empty completion. Learned rewards (`reward_model`, `judge`) are
not called: they load a model, and pre-flight checks their configuration instead. Costs a
worker's start (about a second: the fork server, the rewards' imports).
"""

from __future__ import annotations

import structlog

from grpo_stream.config.run import ScorerSettings
from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards.sandbox import RewardPool, RewardPoolError
from grpo_stream.tasks.base import Problem

LEARNED = ("reward_model", "judge")
"""Rewards that load a model: not called by pre-flight."""


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
    called = [spec for spec in specs if spec.name not in LEARNED]
    if not called:
        return
    sample = sample_completion(problem)
    try:
        quiet = structlog.wrap_logger(structlog.ReturnLogger())  # the one line says it all
        with RewardPool(called, 1, scorer.timeout_s, scorer.memory_limit_mb, quiet) as pool:
            result = pool.score(problem.prompt, [sample], dict(problem.reference))
    except RewardPoolError as exc:
        raise RewardCallError(str(exc).splitlines()[0]) from None
    if not result.errors:
        return
    name, _, cause = result.errors[0].partition("[0]: ")
    keys = ", ".join(sorted(problem.reference)) or "none"
    raise RewardCallError(
        f"reward {name!r} cannot score task {task_name!r}: {cause}, called on the sample "
        f"completion {sample!r} (its problems' reference has the keys: {keys}; a multi-turn "
        "task needs its env.name)"
    )
