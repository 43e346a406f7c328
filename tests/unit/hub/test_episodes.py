"""Episode groups at the hub whose environment no scorer can replay (an agent's: their
rewards are the generator's word): scored on arrival, each ends exactly once, per-turn
advantages reach the batch, malformed ones are refused. Episodes a scorer replays:
tests/unit/hub/test_transcript.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from structlog.testing import capture_logs

from grpo_stream.config import load_config
from grpo_stream.hub.batches import build_batch
from grpo_stream.hub.dispatch import sampling_params
from grpo_stream.hub.registry import Peer
from grpo_stream.protocols import messages as m
from grpo_stream.services.grouper import Grouper
from grpo_stream.transport.sockets import close_context

G = 2
AGENT = "grpo_stream.agents.calc:calc_agent"
"""An agent plays the episodes: no scorer can replay them, the generator's rewards count."""
SAMPLING = sampling_params(load_config(None, []).generator)


def make_hub(tmp_path, *sets: str) -> Grouper:
    cfg = load_config(
        None,
        [f'run.run_dir="{tmp_path}"', 'task.name="guess"', f'env.agent="{AGENT}"',
         f"generator.group_size={G}", "hub.groups_per_step=1", *sets],
    )  # fmt: skip
    return Grouper(cfg)


@pytest.fixture
def hub(tmp_path):
    grouper = make_hub(tmp_path)
    yield grouper
    grouper.server.close()
    close_context(grouper.ctx)


def generator(hub: Grouper) -> Peer:
    peer = Peer("generator", "generator-0", b"gen", "h", 1, 0, {})
    return hub.registry.register(peer, 0.0)


def episode_rollout(gid: int, lease: int, rewards: list[float]) -> m.Rollout:
    """Two episodes: [a0 a1 | e e | a2] (2 turns) and [b0 | e | b1] (2 turns), sampled as
    the hub leases (the run's generator settings)."""
    return m.Rollout(
        lease_id=lease, group_id=gid, instance="generator-0", policy_version=0,
        prompt_ids=np.array([1, 5, 6], np.int32),
        completion_ids=np.array([10, 11, 20, 21, 12, 30, 22, 31], np.int32),
        completion_offsets=np.array([0, 5, 8], np.int64),
        logprobs=np.array([-0.1, -0.2, 0, 0, -0.3, -0.4, 0, -0.5], np.float32),
        texts=["a", "b"], truncated=[False, False], gen_seconds=0.1,
        sampling=SAMPLING,
        loss_mask=np.array([1, 1, 0, 0, 1, 1, 0, 1], np.uint8),
        episode_rewards=np.array(rewards, np.float32),
        turn_rewards=np.array([0.1, 1.0, 0.1, 0.0], np.float32),
        turn_starts=np.array([0, 4, 0, 2], np.int64),
        turn_offsets=np.array([0, 2, 4], np.int64),
    )  # fmt: skip


def lease_one(hub: Grouper) -> tuple[int, int]:
    lease, _ = hub.ledger.take_for_generation("generator-0", 1, 0.0)
    return lease.lease_id, next(iter(lease.group_ids))


def test_an_agents_episode_group_is_buffered_without_a_scorer(hub) -> None:
    peer = generator(hub)
    lease, gid = lease_one(hub)
    hub.intake.on_rollout(peer, episode_rollout(gid, lease, [1.1, 0.1]))
    assert not hub.ledger.to_score and gid not in hub.rollouts
    (group,) = hub.buffer.groups()
    assert group.rewards.tolist() == pytest.approx([1.1, 0.1])
    assert group.loss_mask.tolist() == [1, 1, 0, 0, 1, 1, 0, 1]
    hub.ledger.check_invariant()


def test_an_episode_group_whose_episodes_all_failed_ends_once_as_failed(hub) -> None:
    peer = generator(hub)
    lease, gid = lease_one(hub)
    hub.intake.on_rollout(peer, episode_rollout(gid, lease, [math.nan, math.nan]))
    hub.intake.on_rollout(peer, episode_rollout(gid, lease, [math.nan, math.nan]))  # a duplicate
    summary = hub.ledger.summary()
    assert summary["failed"] == 1 and summary["in_progress"] == 0
    assert summary["duplicates_dropped"] == 1
    hub.ledger.check_invariant()


def test_per_turn_returns_give_each_turn_its_own_token_advantages(tmp_path) -> None:
    hub = make_hub(tmp_path, 'algo.returns="per_turn"', 'algo.advantage.scale="none"')
    try:
        peer = generator(hub)
        lease, gid = lease_one(hub)
        hub.intake.on_rollout(peer, episode_rollout(gid, lease, [1.1, 0.1]))
        (group,) = hub.buffer.groups()
    finally:
        hub.server.close()
        close_context(hub.ctx)
    # returns (gamma 1): a = [1.1, 1.0], b = [0.1, 0.0]; baselines [0.6, 0.5]
    adv = group.token_advantages.tolist()
    assert adv == pytest.approx([0.5, 0.5, 0, 0, 0.5, -0.5, 0, -0.5])
    batch = build_batch(0, [group])
    assert batch.token_advantages.tolist() == pytest.approx(adv)
    assert batch.loss_mask.tolist() == group.loss_mask.tolist()


def test_an_episode_rollout_whose_turns_do_not_fit_is_refused(hub) -> None:
    peer = generator(hub)
    lease, gid = lease_one(hub)
    bad = episode_rollout(gid, lease, [1.0, 0.0])
    bad.loss_mask = bad.loss_mask[:3]
    hub.intake.on_rollout(peer, bad)
    assert hub.server.rejected["bad_rollout"] == 1 and hub.trust.bad_rollouts["generator-0"] == 1
    assert hub.ledger.summary()["in_progress"] == 1  # still awaiting a valid rollout


def play_groups(hub: Grouper, rewards: list[list[float]]) -> None:
    peer = generator(hub)
    for group in rewards:
        lease, gid = lease_one(hub)
        rollout = episode_rollout(gid, lease, group)
        rollout.errors = [f"episode[{i}]: agent raised" for i, r in enumerate(group) if r != r]
        hub.intake.on_rollout(peer, rollout)


def test_failed_episodes_past_the_share_raise_one_alarm_per_crossing(tmp_path) -> None:
    hub = make_hub(tmp_path, "env.alarm_window=4", "env.alarm_failed_share=0.5",
                   "hub.groups_per_step=8", "hub.replay.capacity=64")  # fmt: skip
    try:
        with capture_logs() as logs:
            play_groups(hub, [[1.0, 0.0], [math.nan, 1.0], [math.nan, 0.0]])  # 2 of 4 failed
            play_groups(hub, [[math.nan, math.nan]])  # 3 of 4: still the same alarm
            play_groups(hub, [[1.0, 0.0], [1.0, 0.0]])  # 0 of 4: re-armed
            play_groups(hub, [[math.nan, math.nan]])  # 2 of 4: fires again
        alarms = [e for e in logs if e["event"] == "env.failure_alarm"]
        assert [e["log_level"] for e in alarms] == ["error", "error"]
        assert alarms[0]["alarm"].startswith("2 of the last 4 episodes failed")
        assert "last error: episode[0]: agent raised" in alarms[0]["alarm"]
        assert not hub._stop  # it reports; env.alarm_abort stops
        hub.ledger.check_invariant()
    finally:
        hub.server.close()
        close_context(hub.ctx)


def test_the_alarm_stops_the_run_when_env_alarm_abort_says_so(tmp_path) -> None:
    hub = make_hub(tmp_path, "env.alarm_window=2", "env.alarm_abort=true")
    try:
        play_groups(hub, [[math.nan, 0.0]])
        assert hub._stop and "env.alarm_abort" in hub._shutdown_reason
    finally:
        hub.server.close()
        close_context(hub.ctx)
