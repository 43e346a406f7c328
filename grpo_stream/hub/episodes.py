"""Episode groups at the hub: which rollouts are episodes, their shape, per-turn advantages.

The run's config alone says whether its rollouts are episodes (`env.name` or `env.agent`):
a rollout whose fields say otherwise is refused (`check_kind`), so a generator cannot have
an ordinary prompt taken as an episode and rewarded by itself. An episode whose environment
a scorer can replay is rewarded by that scorer (`grpo_stream.hub.transcript`); one whose
environment cannot be replayed (an agent, an environment that does not declare `replayable`)
trusts its generator's rewards: `scored_by_env` is the Scored a scorer would have sent. Both
then follow the one path every group takes (accept_scored, advantages, buffer or filtered or
failed): it ends exactly once, and the ledger's accounting is unchanged.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from grpo_stream.algo.returns import per_turn_advantages, token_advantages
from grpo_stream.config.algo import AdvantageSettings
from grpo_stream.protocols.messages import Rollout, Scored


def is_episode(rollout: Rollout) -> bool:
    """Whether `rollout` carries episode fields (checked against the config by `check_kind`)."""
    return len(rollout.episode_rewards) > 0


def check_kind(rollout: Rollout, episodes: bool) -> str | None:
    """Why `rollout` is not the kind the run plays (None: it is). `episodes`: the config's."""
    turns = (rollout.turn_rewards, rollout.turn_starts, rollout.turn_offsets)
    carries = any(len(f) > 0 for f in (rollout.loss_mask, rollout.episode_rewards, *turns))
    carries = carries or bool(rollout.errors)
    if carries and not episodes:
        return f"rollout of group {rollout.group_id} carries episode fields: this run plays none"
    if episodes and not is_episode(rollout):
        return f"rollout of group {rollout.group_id} is no episode: this run plays episodes (env)"
    return None


def check_episode(rollout: Rollout) -> str | None:
    """Why an episode Rollout's turn arrays do not fit its completions (None: they do)."""
    g = len(rollout.texts)
    n = len(rollout.completion_ids)
    turns = np.asarray(rollout.turn_offsets)
    if len(rollout.episode_rewards) != g or len(turns) != g + 1:
        return f"episode rollout of group {rollout.group_id}: rewards/turns are not for G={g}"
    if len(rollout.loss_mask) != n:
        return f"episode rollout of group {rollout.group_id}: loss_mask is not per token"
    k = len(rollout.turn_rewards)
    if (
        turns[0] != 0
        or turns[-1] != k
        or len(rollout.turn_starts) != k
        or np.any(np.diff(turns) < 0)
    ):
        return f"episode rollout of group {rollout.group_id}: turn offsets do not cover its turns"
    return None


def scored_by_env(rollout: Rollout) -> Scored:
    """The group's Scored: the environment's outcome rewards, as component "env"."""
    rewards = np.asarray(rollout.episode_rewards, dtype=np.float32)
    return Scored(
        lease_id=rollout.lease_id,
        group_id=rollout.group_id,
        rewards=rewards,
        component_names=["env"],
        components=rewards[None, :].copy(),
        errors=list(rollout.errors),
    )


def per_turn_token_advantages(
    rollout: Rollout, valid: np.ndarray, gamma: float, settings: AdvantageSettings
) -> tuple[np.ndarray, bool]:
    """Per completion token advantages of an episode group under `per_turn` returns, and
    whether the group carries no signal (see grpo_stream.algo.returns)."""
    comp = np.asarray(rollout.completion_offsets)
    turns = np.asarray(rollout.turn_offsets)
    rewards = np.asarray(rollout.turn_rewards, dtype=np.float64)
    starts = np.asarray(rollout.turn_starts)
    mask = np.asarray(rollout.loss_mask)
    g = len(rollout.texts)
    per_episode = [rewards[turns[i] : turns[i + 1]].tolist() for i in range(g)]
    result = per_turn_advantages(per_episode, valid.tolist(), gamma, settings)
    out = [
        token_advantages(
            result.advantages[i],
            starts[turns[i] : turns[i + 1]].tolist(),
            mask[comp[i] : comp[i + 1]].tolist(),
        )
        for i in range(g)
    ]
    flat = np.concatenate(out) if out else np.zeros(0, np.float32)
    return flat.astype(np.float32), result.zero_signal


class FailureAlarm:
    """The run-level alarm on failed episodes (an environment or agent that raised, hung or
    exceeded a limit: NaN episode rewards). It fires when at least `share` of the last
    `window` episodes failed, once per crossing: it re-arms when the share falls below."""

    def __init__(self, share: float, window: int) -> None:
        self.share = share
        self.recent: deque[bool] = deque(maxlen=window)
        self.firing = False
        self.fired = 0

    def add(self, rollout: Rollout) -> str | None:
        """Count a group's episodes; the alarm's one line when it fires now, else None."""
        self.recent.extend(bool(np.isnan(r)) for r in np.asarray(rollout.episode_rewards))
        failed = sum(self.recent)
        full = len(self.recent) == self.recent.maxlen
        if not full or failed < self.share * len(self.recent):
            self.firing = False
            return None
        if self.firing:
            return None
        self.firing = True
        self.fired += 1
        last = rollout.errors[-1] if rollout.errors else "no error reported"
        return (
            f"{failed} of the last {len(self.recent)} episodes failed "
            f"(env.alarm_failed_share={self.share}, env.alarm_window={self.recent.maxlen}); "
            f"last error: {last}"
        )
