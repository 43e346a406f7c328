"""The hub's checks against strangers: each of the attacks that used to harm a run is
refused before it changes anything."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.hub import guard
from grpo_stream.hub.registry import Peer, Registry
from grpo_stream.protocols import messages as m
from grpo_stream.transport.sockets import Client, Server, close_context, make_context

sys.path.insert(0, str(Path(__file__).parent))
from test_serving import GPS, Desk, request


def hello(instance: str, weights: str) -> m.Hello:
    return m.Hello(
        service="trainer", instance=instance, host="h", pid=1, capacity=1, rank=0,
        endpoints=m.Endpoints(weights=weights, announce="tcp://h:9"),
    )  # fmt: skip


def test_a_second_rank0_trainer_cannot_rewrite_the_weight_endpoints() -> None:
    registry = Registry(10.0)
    registry.register(Peer("trainer", "trainer-0", b"trainer-0", "h", 1, 0, {}), 0.0)
    stranger = hello("trainer-evil", "tcp://127.0.0.1:1")
    assert guard.check_hello(stranger, registry) is not None
    assert guard.check_hello(hello("trainer-0", "tcp://h:2"), registry) is None
    assert "not a tcp://" in str(guard.check_hello(hello("trainer-0", "http://h:2"), registry))


def test_a_batch_request_beyond_what_the_trainer_can_have_asked_is_refused() -> None:
    d = Desk()
    d.buffer_groups(GPS)
    d.desk.add(b"r0", request(0))
    d.desk.serve()
    huge = m.BatchRequest(step=10**6, trainer_version=10**6)
    assert d.desk.refusal(huge, ranks=1) is not None
    assert d.desk.refusal(request(1), ranks=1) is None


def test_a_scored_with_the_wrong_number_of_rewards_is_refused() -> None:
    rollout = m.Rollout(
        lease_id=1, group_id=0, instance="g", policy_version=0,
        prompt_ids=np.zeros(1, np.int32), completion_ids=np.zeros(8, np.int32),
        completion_offsets=np.arange(9, dtype=np.int64), logprobs=np.zeros(8, np.float32),
        texts=["x"] * 8, truncated=[False] * 8, gen_seconds=0.1,
        sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
    )  # fmt: skip
    assert guard.check_rollout(rollout, group_size=8) is None
    three = m.Scored(
        lease_id=1, group_id=0, rewards=np.zeros(3, np.float32), component_names=["r"],
        components=np.zeros((1, 3), np.float32), errors=[],
    )  # fmt: skip
    assert guard.check_scored(three, rollout) is not None


def test_a_second_connection_with_a_live_identity_does_not_take_it_over() -> None:
    ctx = make_context()
    t, sec = TransportSettings(), SecuritySettings()
    server = Server(ctx, "tcp://127.0.0.1:0", t, sec, name="hub")
    real = Client(ctx, server.address, t, sec, "trainer-0")
    real.send(m.StatusRequest())
    assert server.recv(5000) is not None  # the real peer is connected
    stranger = Client(ctx, server.address, t, sec, "trainer-0")
    stranger.send(m.StatusRequest())
    time.sleep(0.5)
    server.recv(200)  # whatever the stranger managed to send
    server.send(b"trainer-0", m.Shutdown(reason="for the real one"))
    assert isinstance(real.recv(5000), m.Shutdown)  # still routed to the real connection
    assert stranger.recv(500) is None
    for sock in (real, stranger, server):
        sock.close()
    close_context(ctx)


def spanning_rollout(starts: list[int], versions: list[int], policy_version: int) -> m.Rollout:
    """A group of 2 completions of 4 tokens, with in-flight version runs."""
    return m.Rollout(
        lease_id=1, group_id=0, instance="g", policy_version=policy_version,
        prompt_ids=np.zeros(1, np.int32), completion_ids=np.zeros(8, np.int32),
        completion_offsets=np.array([0, 4, 8], np.int64), logprobs=np.zeros(8, np.float32),
        texts=["x"] * 2, truncated=[False] * 2, gen_seconds=0.1,
        sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=4),
        token_version_starts=np.array(starts, np.int64),
        token_versions=np.array(versions, np.int64),
    )  # fmt: skip


def test_token_version_runs_from_zero_with_the_oldest_as_policy_version_pass() -> None:
    assert guard.check_rollout(spanning_rollout([0, 2, 4, 6], [3, 4, 3, 4], 3), 2) is None


def test_token_version_runs_that_are_not_increasing_from_zero_are_refused() -> None:
    assert guard.check_rollout(spanning_rollout([1, 2], [3, 4], 3), 2) is not None
    assert guard.check_rollout(spanning_rollout([0, 4, 4], [3, 4, 5], 3), 2) is not None
    assert guard.check_rollout(spanning_rollout([0, 8], [3, 4], 3), 2) is not None  # past T


def test_a_policy_version_newer_than_its_oldest_token_is_refused() -> None:
    # a generator claiming its newest version would make old tokens look fresh
    assert guard.check_rollout(spanning_rollout([0, 2], [3, 4], 4), 2) is not None
