"""The replay buffer: capacity, reuse, staleness eviction, sampling policies, state."""

from __future__ import annotations

import numpy as np

from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.replay import Group, ReplayBuffer
from grpo_stream.hub.versions import PolicyVersions
from grpo_stream.protocols.messages import SamplingParams


def at(trainer_version: int, max_staleness: int = 1) -> PolicyVersions:
    """The ledger's versions (owner of staleness) with the trainer at `trainer_version`."""
    ledger = Ledger(groups_per_step=4, max_staleness=max_staleness, lease_timeout_s=10.0)
    ledger.versions.observe_trainer(trainer_version)
    return ledger.versions


def group(gid: int, version: int = 0, adv: float = 1.0) -> Group:
    return Group(
        group_id=gid,
        policy_version=version,
        prompt_ids=np.array([1, 2], np.int32),
        completion_ids=np.array([3, 4, 5], np.int32),
        completion_offsets=np.array([0, 1, 3], np.int64),
        logprobs=np.array([-1.0, -0.5, -0.2], np.float32),
        rewards=np.array([1.0, 0.0], np.float32),
        advantages=np.array([adv, -adv], np.float32),
        valid=np.array([True, True]),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
    )


def test_capacity_evicts_oldest() -> None:
    buf = ReplayBuffer(capacity=2)
    buf.add(group(0))
    buf.add(group(1))
    evicted = buf.add(group(2))
    assert [g.group_id for g in evicted] == [0] and len(buf) == 2


def test_fifo_hands_out_each_group_once_with_reuse_one() -> None:
    buf = ReplayBuffer(capacity=8)
    for i in range(4):
        buf.add(group(i))
    first = buf.sample(2, at(0).is_stale)
    second = buf.sample(2, at(0).is_stale)
    assert [g.group_id for g in first.groups] == [0, 1]
    assert [g.group_id for g in second.groups] == [2, 3]
    assert len(buf) == 0


def test_reuse_two_hands_out_a_group_twice_first_use_flagged_once() -> None:
    buf = ReplayBuffer(capacity=8, reuse=2)
    buf.add(group(0))
    a = buf.sample(1, at(0).is_stale)
    b = buf.sample(1, at(0).is_stale)
    assert a.first_use == [True] and b.first_use == [False]
    assert buf.sample(1, at(0).is_stale).groups == []


def test_stale_groups_are_evicted_not_handed_out() -> None:
    buf = ReplayBuffer(capacity=8)
    buf.add(group(0, version=0))
    buf.add(group(1, version=3))
    got = buf.sample(2, at(4).is_stale)
    assert [g.group_id for g in got.groups] == [1]
    assert [g.group_id for g in got.stale] == [0]


def test_priority_prefers_large_advantages() -> None:
    buf = ReplayBuffer(capacity=8, sampling="priority")
    buf.add(group(0, adv=0.1))
    buf.add(group(1, adv=2.0))
    assert [g.group_id for g in buf.sample(1, at(0).is_stale).groups] == [1]


def test_uniform_is_seeded() -> None:
    picks = []
    for _ in range(2):
        buf = ReplayBuffer(capacity=16, sampling="uniform", seed=7)
        for i in range(10):
            buf.add(group(i))
        picks.append([g.group_id for g in buf.sample(3, at(0).is_stale).groups])
    assert picks[0] == picks[1]


def test_state_round_trip_keeps_arrays_and_uses() -> None:
    buf = ReplayBuffer(capacity=8, reuse=2)
    buf.add(group(5, version=2))
    buf.sample(1, at(2).is_stale)
    other = ReplayBuffer(capacity=8, reuse=2)
    other.load_state(buf.state())
    (g,) = list(other.groups())
    assert g.uses == 1 and g.policy_version == 2
    assert np.array_equal(g.logprobs, group(5).logprobs)
