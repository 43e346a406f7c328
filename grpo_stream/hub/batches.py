"""Turning messages into groups and groups into TrainBatches.

A group becomes trainable when its G completions are scored: rewards are combined by the
scorer, advantages come from the GRPO core (`grpo_stream.algo.advantages`). A TrainBatch
holds each valid completion as one sequence (prompt + completion tokens, flat with offsets),
its behaviour log-probs (completion tokens only), advantage, reward and policy version.
Completions whose reward failed (NaN) or that are empty carry no signal and are left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from grpo_stream.algo.overlong import Overlong
from grpo_stream.config.algo import AdvantageSettings
from grpo_stream.hub.episodes import is_episode, per_turn_token_advantages
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.registry import Peer
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.messages import (
    BatchTotals,
    Rollout,
    SamplingParams,
    Scored,
    StepStats,
    TrainBatch,
)


@dataclass
class Assembled:
    """A scored group and whether it carries a learning signal."""

    group: Group
    zero_signal: bool
    failed: bool


def assemble(
    rollout: Rollout,
    scored: Scored,
    settings: AdvantageSettings,
    batch_std: float | None,
    returns: Literal["outcome", "per_turn"] = "outcome",
    gamma: float = 1.0,
    overlong: Overlong | None = None,
) -> Assembled:
    """Combine a Rollout and its Scored into a Group with advantages (episodes under
    `algo.returns = "per_turn"`: per-token advantages, see grpo_stream.hub.episodes), shaped
    by `overlong` (`grpo_stream.algo.overlong`: the soft penalty enters the advantages only;
    under mask the truncated completions become no sequence)."""
    import torch

    from grpo_stream.algo.advantages import group_advantages

    overlong = overlong or Overlong()
    rewards = np.asarray(scored.rewards, dtype=np.float32)
    shaped = overlong.rewards(rewards, rollout.completion_offsets, rollout.sampling.max_tokens)
    result = group_advantages(torch.from_numpy(shaped.copy()), settings, batch_std=batch_std)
    valid = result.valid_mask.numpy().astype(bool)
    failed = not valid.any()
    valid = overlong.trained(valid, list(rollout.truncated))
    zero_signal = bool(result.zero_signal) or not valid.any()  # nothing left to train
    token_adv = np.zeros(0, np.float32)
    if is_episode(rollout) and returns == "per_turn":
        token_adv, zero_signal = per_turn_token_advantages(rollout, valid, gamma, settings)
    group = Group(
        group_id=rollout.group_id,
        policy_version=rollout.policy_version,
        prompt_ids=np.array(rollout.prompt_ids, dtype=np.int32),
        completion_ids=np.array(rollout.completion_ids, dtype=np.int32),
        completion_offsets=np.array(rollout.completion_offsets, dtype=np.int64),
        logprobs=np.array(rollout.logprobs, dtype=np.float32),
        rewards=rewards,
        advantages=result.advantages.numpy().astype(np.float32),
        valid=valid,
        truncated=list(rollout.truncated),
        sampling=rollout.sampling,
        loss_mask=np.array(rollout.loss_mask, dtype=np.uint8),
        token_advantages=token_adv,
    )
    return Assembled(group=group, zero_signal=zero_signal, failed=failed)


def kept(g: Group) -> Iterator[tuple[int, int, int]]:
    """(completion, start, end) of each completion of `g` that becomes a sequence: a valid
    reward and at least one token."""
    for i in range(g.size):
        lo, hi = int(g.completion_offsets[i]), int(g.completion_offsets[i + 1])
        if g.valid[i] and hi > lo:
            yield i, lo, hi


def build_step(
    step: int, groups: list[Group], stats: StepStats, world: int = 1
) -> list[TrainBatch]:
    """The step's TrainBatch shards, one per trainer rank (rank r gets groups r, r+W, ...),
    each with the whole step's totals (the ranks' loss normalisers)."""
    totals = step_totals(step, groups)
    return [shard(step, groups[r::world], totals, groups[0].sampling, stats) for r in range(world)]


def step_totals(step: int, groups: list[Group]) -> BatchTotals:
    """The step's loss normalisers; its groups must all have been sampled alike."""
    if not groups:
        raise ValueError(f"step {step}: no groups to train on")
    samplings = {(s.temperature, s.top_p, s.max_tokens) for s in (g.sampling for g in groups)}
    if len(samplings) > 1:
        raise ValueError(f"step {step}: its groups were sampled differently: {sorted(samplings)}")
    seqs = [(g, lo, hi) for g in groups for _, lo, hi in kept(g)]
    return BatchTotals(
        num_seqs=len(seqs), num_tokens=sum(_trained(g, lo, hi) for g, lo, hi in seqs)
    )


def _trained(g: Group, lo: int, hi: int) -> int:
    """Tokens of completion [lo, hi) the loss covers: all, or an episode's sampled ones."""
    return int(g.loss_mask[lo:hi].sum()) if len(g.loss_mask) else hi - lo


def build_batch(step: int, groups: list[Group], stats: StepStats | None = None) -> TrainBatch:
    """One single-rank TrainBatch; without `stats` (a batch built outside a hub: tests,
    benchmarks) the statistics are the groups' own (`offline_stats`)."""
    return build_step(step, groups, offline_stats(groups) if stats is None else stats)[0]


def shard(
    step: int,
    groups: list[Group],
    totals: BatchTotals,
    sampling: SamplingParams,
    stats: StepStats,
) -> TrainBatch:
    """Flatten groups into one TrainBatch (sequences in group order)."""
    ids: list[np.ndarray] = []
    logps: list[np.ndarray] = []
    prompt_lens, advs, rewards, versions = [], [], [], []
    per_group = []  # sequences of each group
    for g in groups:
        per_group.append(sum(1 for _ in kept(g)))
        for i, lo, hi in kept(g):
            ids.append(np.concatenate([g.prompt_ids, g.completion_ids[lo:hi]]))
            logps.append(g.logprobs[lo:hi])
            prompt_lens.append(len(g.prompt_ids))
            advs.append(g.advantages[i])
            rewards.append(g.rewards[i])
            versions.append(g.policy_version)
    loss_mask, token_advantages = _per_token(groups)
    lengths = [len(x) for x in ids]
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    return TrainBatch(
        step=step,
        group_ids=np.array([g.group_id for g in groups], dtype=np.int64),
        input_ids=np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32),
        seq_offsets=offsets,
        prompt_lens=np.array(prompt_lens, dtype=np.int32),
        behaviour_logprobs=np.concatenate(logps).astype(np.float32)
        if logps
        else np.zeros(0, np.float32),
        advantages=np.array(advs, dtype=np.float32),
        rewards=np.array(rewards, dtype=np.float32),
        versions=np.array(versions, dtype=np.int32),
        group_offsets=np.concatenate([[0], np.cumsum(per_group)]).astype(np.int64),
        totals=totals,
        sampling=sampling,
        stats=stats,
        loss_mask=loss_mask,
        token_advantages=token_advantages,
    )


def _per_token(groups: list[Group]) -> tuple[np.ndarray, np.ndarray]:
    """The batch's loss mask and per-token advantages over its completion tokens, in
    `_shard`'s sequence order; each empty when no group has one (single-turn batches)."""
    any_mask = any(len(g.loss_mask) for g in groups)
    any_adv = any(len(g.token_advantages) for g in groups)
    if not (any_mask or any_adv):
        return np.zeros(0, np.uint8), np.zeros(0, np.float32)
    masks: list[np.ndarray] = []
    advs: list[np.ndarray] = []
    for g in groups:
        for i, lo, hi in kept(g):
            masks.append(g.loss_mask[lo:hi] if len(g.loss_mask) else np.ones(hi - lo, np.uint8))
            if len(g.token_advantages):
                advs.append(g.token_advantages[lo:hi])
            else:
                advs.append(np.full(hi - lo, g.advantages[i], np.float32))
    mask = np.concatenate(masks).astype(np.uint8) if any_mask and masks else np.zeros(0, np.uint8)
    adv = np.concatenate(advs).astype(np.float32) if any_adv and advs else np.zeros(0, np.float32)
    return mask, adv


def step_stats(
    groups: list[Group],
    filtered_rewards: list[float],
    ledger: Ledger,
    generators: list[Peer],
    buffer_size: int,
    peers_lost: int,
    distill_kl: float = float("nan"),
    scorers: Sequence[Peer] = (),
) -> StepStats:
    """A step's statistics as the hub knows them when it serves the step (`distill_kl`: the
    mean reverse KL from the teacher of the step's taught groups, NaN without a teacher;
    `scorers`: the scorers whose heartbeats give the CPU cost of a completion)."""
    mean, std, pass_rate = reward_stats(groups, filtered_rewards)
    c = ledger.counters
    reporting = [p for p in generators if p.generator is not None and p.generator.batches]
    reports = [p.generator for p in reporting if p.generator is not None]
    return StepStats(
        reward_mean=mean,
        reward_std=std,
        pass_rate=pass_rate,
        staleness_mean=mean_staleness(groups, ledger.versions.staleness),
        staleness_counts=staleness_counts(groups, ledger.versions.staleness),
        groups_dispatched=c["dispatched"],
        groups_trained=c["trained"],
        groups_filtered=c["filtered"],
        groups_stale=c["stale"],
        groups_failed=c["failed"],
        groups_discarded=c["discarded"],
        groups_in_progress=ledger.in_pipeline(),
        groups_redispatched=c["redispatched"],
        groups_duplicates_dropped=c["duplicates_dropped"],
        buffer_size=buffer_size,
        peers_lost=peers_lost,
        gen_instances=[p.instance for p in reporting],
        gen_tokens_per_s=[r.tokens_per_s for r in reports],
        gen_wait_s=float(sum(r.wait_s for r in reports)),
        step_groups=len(groups),
        groups_refilled=c["refilled"],
        signal_rate=ledger.refill.signal_rate(),
        distill_kl=distill_kl,
        scorer_cpu_s_per_completion=scorer_cpu_per_completion(scorers),
    )


def scorer_cpu_per_completion(scorers: Sequence[Peer]) -> float:
    """CPU seconds per completion over the scorers' last heartbeats (NaN before any scored)."""
    reports = [p.scorer for p in scorers if p.scorer is not None]
    completions = sum(r.completions for r in reports)
    return math.fsum(r.cpu_s for r in reports) / completions if completions else float("nan")


def offline_stats(groups: list[Group]) -> StepStats:
    """StepStats of groups batched outside a hub: their rewards; no ledger, no generators."""
    mean, std, pass_rate = reward_stats(groups, [])
    return StepStats(
        reward_mean=mean,
        reward_std=std,
        pass_rate=pass_rate,
        staleness_mean=0.0,
        staleness_counts=[],
        groups_dispatched=0,
        groups_trained=0,
        groups_filtered=0,
        groups_stale=0,
        groups_failed=0,
        groups_discarded=0,
        groups_in_progress=0,
        groups_redispatched=0,
        groups_duplicates_dropped=0,
        buffer_size=0,
        peers_lost=0,
        gen_instances=[],
        gen_tokens_per_s=[],
        gen_wait_s=0.0,
        step_groups=len(groups),
        groups_refilled=0,
        signal_rate=1.0,
        distill_kl=float("nan"),
        scorer_cpu_s_per_completion=float("nan"),
    )


def mean_staleness(groups: list[Group], staleness: Callable[[int], int]) -> float:
    """Mean versions behind the trainer over the sequences the groups become (`staleness`:
    the ledger's, the one owner)."""
    behind = [staleness(g.policy_version) for g in groups for _ in kept(g)]
    return float(np.mean(behind)) if behind else 0.0


def staleness_counts(groups: list[Group], staleness: Callable[[int], int]) -> list[int]:
    """How many of the sequences the groups become are 0, 1, 2, ... versions behind the
    trainer (`staleness`: the ledger's); empty when there are none."""
    behind = [staleness(g.policy_version) for g in groups for _ in kept(g)]
    return np.bincount(behind).tolist() if behind else []


def reward_stats(groups: list[Group], filtered_rewards: list[float]) -> tuple[float, float, float]:
    """(mean, std, pass rate) of a step's rewards: over the batch's groups and the groups
    filtered since the last batch (all-correct and all-wrong groups count too, or the mean
    would be biased); NaN when there is none."""
    rewards = [float(r) for g in groups for r in g.rewards if np.isfinite(r)] + filtered_rewards
    if not rewards:
        return float("nan"), float("nan"), float("nan")
    return (
        float(np.mean(rewards)),
        float(np.std(rewards)),
        float(np.mean([r >= 1.0 for r in rewards])),
    )


def failure_streak(msg: Scored, in_row: int, limit: int) -> str | None:
    """Why the run stops after `in_row` groups in a row whose every reward failed (the last
    one `msg`), or None below `run.abort_after_failed_groups` (`limit`)."""
    if in_row < limit:
        return None
    names = list(msg.component_names)
    comps = np.asarray(msg.components, dtype=np.float32).reshape(len(names), -1)
    failing = [n for n, row in zip(names, comps, strict=True) if np.isnan(row).all()]
    last = msg.errors[-1] if msg.errors else "no error reported"
    return (
        f"{in_row} groups in a row had every reward fail "
        f"(run.abort_after_failed_groups={limit}); "
        f"failing reward(s): {', '.join(failing) or '?'}; last error: {last}"
    )
