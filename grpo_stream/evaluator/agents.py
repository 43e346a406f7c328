"""Evaluation of an agent run (env.agent set): the evaluation problems played by the run's
agent against the evaluator's own endpoint, exactly as in training.

So evaluation parses the model's function calls with the one parser training uses
(`grpo_stream.agents.toolcalls`, behind the endpoint), renders tools and turns with the same
chat template code, and rewards episodes with the agent's own reward: no second path that
could read a call differently.

Invariants: `eval.k` episodes per problem, sampled at eval.temperature (greedy with
eval.greedy); an episode is correct when its reward is at least 1.0; pass@1 and pass@k are
the unbiased estimators of `grpo_stream.evaluation.pass_at_k`; failed episodes (NaN) count
as incorrect and are reported, never dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from grpo_stream.agents.player import AgentPlayer
from grpo_stream.config.evaluator import EvalSettings
from grpo_stream.envs.episodes import EpisodeRun
from grpo_stream.evaluation import GREEDY_TOP_P, pass_at_k
from grpo_stream.sampling import Sampling
from grpo_stream.tasks.base import Problem


def evaluate_agent(
    player: AgentPlayer,
    problems: Sequence[Problem],
    ev: EvalSettings,
    sampling: Sampling,
) -> dict[str, Any]:
    """The eval.jsonl fields of one evaluation of the agent on `problems`, sampled as
    `sampling` (the run's, with its seed) says where the eval settings do not."""
    before = player.stats()
    run = EpisodeRun(
        prompts=[p.prompt for p in problems],
        references=[p.reference for p in problems],
        group_size=ev.k,
        sampling=replace(
            sampling,
            max_tokens=ev.max_tokens or sampling.max_tokens,
            temperature=ev.temperature or sampling.temperature,
            top_p=GREEDY_TOP_P if ev.greedy else 1.0,
        ),
    )
    groups = player.play_run(run)
    rewards = [[e.reward for e in group] for group in groups]
    correct = [sum(r >= 1.0 for r in group) for group in rewards]  # NaN >= 1.0 is False
    finite = [r for group in rewards for r in group if math.isfinite(r)]
    after = player.stats()
    return {
        "eval/pass@1": sum(pass_at_k(ev.k, c, 1) for c in correct) / len(correct),
        "eval/pass@k": sum(pass_at_k(ev.k, c, ev.k) for c in correct) / len(correct),
        "eval/reward": sum(finite) / len(finite) if finite else math.nan,
        "eval/episodes_failed": after["episodes_failed"] - before["episodes_failed"],
        "eval/tool_calls": after["tool_calls"] - before["tool_calls"],
        "eval/tool_calls_malformed": (
            after["tool_calls_malformed"] - before["tool_calls_malformed"]
        ),
        "eval/truncated": sum(e.truncated for group in groups for e in group),
    }
