"""Step metrics computed by the hub: rewards include filtered groups; NaN rewards are skipped."""

from __future__ import annotations

import math

import numpy as np

from grpo_stream.hub.batches import reward_stats, step_stats
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.registry import Peer
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.messages import GeneratorStats, SamplingParams, ScorerStats


def _group(rewards: list[float]) -> Group:
    g = len(rewards)
    return Group(
        group_id=0,
        policy_version=0,
        prompt_ids=np.zeros(1, np.int32),
        completion_ids=np.zeros(g, np.int32),
        completion_offsets=np.arange(g + 1, dtype=np.int64),
        logprobs=np.zeros(g, np.float32),
        rewards=np.array(rewards, np.float32),
        advantages=np.zeros(g, np.float32),
        valid=~np.isnan(np.array(rewards)),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
    )


def test_reward_counts_filtered_groups_and_skips_nan() -> None:
    mean, _, pass_rate = reward_stats([_group([1.0, 0.0, float("nan")])], [1.0, 1.0])
    assert mean == 0.75 and pass_rate == 0.75


def test_no_rewards_give_nan_not_zero() -> None:
    assert all(math.isnan(x) for x in reward_stats([], []))


def _generator(instance: str, tokens_per_s: float, wait_s: float) -> Peer:
    peer = Peer("generator", instance, instance.encode(), "h", 1, 0, {})
    peer.generator = GeneratorStats(tokens_per_s, wait_s, 0, 1, 4, 1.0)
    return peer


def test_step_stats_take_staleness_from_the_ledger() -> None:
    ledger = Ledger(groups_per_step=2, max_staleness=4, lease_timeout_s=10.0)
    ledger.versions.observe_trainer(5)
    old, new = _group([1.0, 0.0]), _group([1.0, 0.0])
    old.policy_version, new.policy_version = 2, 5  # 3 and 0 versions behind, 2 sequences each
    stats = step_stats([old, new], [], ledger, [], buffer_size=0, peers_lost=0)
    assert stats.staleness_mean == 1.5
    assert stats.staleness_counts == [2, 0, 0, 2]  # sequences 0, 1, 2, 3 versions behind


def test_step_stats_carry_the_ledger_counters_and_each_generators_rate() -> None:
    ledger = Ledger(groups_per_step=2, max_staleness=1, lease_timeout_s=10.0)
    taken = ledger.take_for_generation("generator-0", 3, now=0.0)
    assert taken is not None
    ledger.finish(0, "stale")
    gens = [_generator("generator-0", 10.0, 1.5), _generator("generator-1", 30.0, 0.5)]
    silent = Peer("generator", "generator-2", b"g2", "h", 1, 0, {})  # no heartbeat stats yet
    stats = step_stats([_group([1.0])], [], ledger, [*gens, silent], 7, peers_lost=2)
    assert (stats.groups_dispatched, stats.groups_stale, stats.groups_in_progress) == (3, 1, 2)
    assert (stats.buffer_size, stats.peers_lost) == (7, 2)
    assert stats.gen_instances == ["generator-0", "generator-1"]
    assert stats.gen_tokens_per_s == [10.0, 30.0] and stats.gen_wait_s == 2.0


def _scorer(instance: str, stats: ScorerStats | None) -> Peer:
    peer = Peer("scorer", instance, instance.encode(), "h", 1, 0, {})
    peer.scorer = stats
    return peer


def test_step_stats_give_the_scorers_cpu_seconds_per_completion() -> None:
    ledger = Ledger(groups_per_step=2, max_staleness=1, lease_timeout_s=10.0)
    scorers = [
        _scorer("scorer-0", ScorerStats(3.0, completions=100, groups=13, calls=60, workers=2)),
        _scorer("scorer-1", ScorerStats(1.0, completions=300, groups=38, calls=90, workers=1)),
        _scorer("scorer-2", None),  # no heartbeat stats yet
    ]
    stats = step_stats([_group([1.0])], [], ledger, [], 0, 0, scorers=scorers)
    assert stats.scorer_cpu_s_per_completion == 4.0 / 400


def test_the_scorers_cpu_is_nan_before_any_completion_is_scored() -> None:
    ledger = Ledger(groups_per_step=2, max_staleness=1, lease_timeout_s=10.0)
    idle = _scorer("scorer-0", ScorerStats(cpu_s=0.5, completions=0, groups=0, calls=0, workers=1))
    assert math.isnan(step_stats([], [], ledger, [], 0, 0).scorer_cpu_s_per_completion)
    stats = step_stats([], [], ledger, [], 0, 0, scorers=[idle])
    assert math.isnan(stats.scorer_cpu_s_per_completion)
