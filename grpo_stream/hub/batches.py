"""Turning messages into groups and groups into TrainBatches.

A group becomes trainable when its G completions are scored: rewards are combined by the
scorer, advantages come from the GRPO core (`grpo_stream.algo.advantages`). A TrainBatch
holds each valid completion as one sequence (prompt + completion tokens, flat with offsets),
its behaviour log-probs (completion tokens only), advantage, reward and policy version.
Completions whose reward failed (NaN) or that are empty carry no signal and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from grpo_stream.algo.settings import AdvantageSettings
from grpo_stream.hub.ledger import staleness
from grpo_stream.hub.registry import Peer
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.messages import Rollout, Scored, TrainBatch


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
) -> Assembled:
    """Combine a Rollout and its Scored into a Group with advantages (episodes under
    `algo.returns = "per_turn"`: per-token advantages, see grpo_stream.hub.episodes)."""
    import torch

    from grpo_stream.algo.advantages import group_advantages
    from grpo_stream.hub.episodes import is_episode, per_turn_token_advantages

    rewards = np.asarray(scored.rewards, dtype=np.float32)
    result = group_advantages(torch.from_numpy(rewards.copy()), settings, batch_std=batch_std)
    valid = result.valid_mask.numpy().astype(bool)
    zero_signal = bool(result.zero_signal)
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
        loss_mask=np.array(rollout.loss_mask, dtype=np.uint8),
        token_advantages=token_adv,
    )
    return Assembled(group=group, zero_signal=zero_signal, failed=not valid.any())


def build_batch(
    step: int, groups: list[Group], trainer_version: int, stats: dict[str, Any]
) -> TrainBatch:
    """Flatten groups into one TrainBatch (sequences in group order)."""
    ids: list[np.ndarray] = []
    logps: list[np.ndarray] = []
    prompt_lens, advs, rewards, versions = [], [], [], []
    for g in groups:
        for i in range(g.size):
            lo, hi = int(g.completion_offsets[i]), int(g.completion_offsets[i + 1])
            if not g.valid[i] or hi == lo:
                continue
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
        loss_mask=loss_mask,
        token_advantages=token_advantages,
        stats={
            **stats,
            "staleness_mean": float(np.mean([staleness(trainer_version, v) for v in versions]))
            if versions
            else 0.0,
        },
    )


def _per_token(groups: list[Group]) -> tuple[np.ndarray, np.ndarray]:
    """The batch's loss mask and per-token advantages over its completion tokens, in
    build_batch's sequence order; each empty when no group has one (single-turn batches)."""
    masks: list[np.ndarray] = []
    advs: list[np.ndarray] = []
    any_mask = any(len(g.loss_mask) for g in groups)
    any_adv = any(len(g.token_advantages) for g in groups)
    for g in groups if any_mask or any_adv else []:
        for i in range(g.size):
            lo, hi = int(g.completion_offsets[i]), int(g.completion_offsets[i + 1])
            if not g.valid[i] or hi == lo:
                continue
            masks.append(g.loss_mask[lo:hi] if len(g.loss_mask) else np.ones(hi - lo, np.uint8))
            if len(g.token_advantages):
                advs.append(g.token_advantages[lo:hi])
            else:
                advs.append(np.full(hi - lo, g.advantages[i], np.float32))
    mask = np.concatenate(masks).astype(np.uint8) if any_mask and masks else np.zeros(0, np.uint8)
    adv = np.concatenate(advs).astype(np.float32) if any_adv and advs else np.zeros(0, np.float32)
    return mask, adv


def reward_stats(groups: list[Group], filtered_rewards: list[float]) -> dict[str, float]:
    """Reward of a step: over the batch's groups and the groups filtered since the last batch
    (all-correct and all-wrong groups count too, or the mean would be biased)."""
    rewards = [float(r) for g in groups for r in g.rewards if np.isfinite(r)] + filtered_rewards
    if not rewards:
        return {"reward_mean": float("nan"), "reward_std": float("nan"), "pass_rate": float("nan")}
    return {
        "reward_mean": float(np.mean(rewards)),
        "reward_std": float(np.std(rewards)),
        "pass_rate": float(np.mean([r >= 1.0 for r in rewards])),
    }


def generator_stats(generators: list[Peer]) -> dict[str, Any]:
    """Throughput and credit waits the generators reported in their heartbeats."""
    return {
        "gen_tokens_per_s": {
            p.instance: float(p.stats.get("tokens_per_s", 0.0)) for p in generators
        },
        "gen_wait_s": float(sum(float(p.stats.get("wait_s", 0.0)) for p in generators)),
    }
