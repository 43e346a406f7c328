"""The hub's stall watchdog: silent while steps are served; every run.stall_report_s
without one it says why (the first cause found), and past run.stall_abort_s it stops."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from grpo_stream.config import load_config
from grpo_stream.hub.registry import Peer
from grpo_stream.hub.watchdog import StallAbort, Watchdog
from grpo_stream.protocols import messages as m
from grpo_stream.services.grouper import Grouper
from grpo_stream.transport.sockets import close_context


@pytest.fixture
def hub(tmp_path):
    cfg = load_config(None, [f'run.run_dir="{tmp_path}"', "hub.groups_per_step=2"])
    grouper = Grouper(cfg)
    yield grouper
    grouper.server.close()
    close_context(grouper.ctx)


READY = m.GeneratorStats(
    tokens_per_s=0.0, wait_s=0.0, version=0, batches=0, prompts_total=0, busy_s=0.0
)
"""What a generator's heartbeats carry once its engine is built (before, nothing)."""


def _join(hub: Grouper, *services: str, loading: bool = False) -> None:
    for service in services:
        peer = Peer(service, f"{service}-0", service.encode(), "h", 1, 0, {})
        if service == "generator" and not loading:
            peer.generator = READY
        hub.registry.register(peer, 0.0)


def _ask(hub: Grouper) -> None:
    hub.desk.add(b"trainer", m.BatchRequest(step=0, trainer_version=0))


def _filter(hub: Grouper, groups: int, reward: float) -> None:
    """Groups that went through generation and scoring, all completions scoring alike."""
    lease, _ = hub.ledger.take_for_generation("generator-0", groups, 0.0)
    for gid in sorted(lease.group_ids):
        hub.ledger.accept_rollout(gid)
        hub.ledger.accept_scored(gid)
        hub.window_rewards.extend([reward] * 8)
        hub.ledger.finish(gid, "filtered")


def _stalls(hub: Grouper, dog: Watchdog, *times: float) -> list[dict[str, object]]:
    with capture_logs() as logs:
        for t in times:
            dog.check(t, hub)
    return [e for e in logs if e["event"] == "hub.stall"]


def test_zero_signal_filtering_is_named_with_the_reward_distribution(hub):
    _join(hub, "trainer", "generator", "scorer")
    dog = Watchdog(hub.cfg.run, now=0.0)
    _ask(hub)
    dog.check(1.0, hub)  # the trainer asked: the clock starts
    _filter(hub, groups=3, reward=0.0)
    stalls = _stalls(hub, dog, 20.0, 31.5)
    assert len(stalls) == 1
    why = str(stalls[0]["why"])
    assert "all 3 groups scored were filtered as zero-signal" in why
    assert "max 0.00 over 24 completions" in why
    assert "algo.advantage.filter_zero_signal" in why


def test_a_missing_generator_is_named_first(hub):
    _join(hub, "trainer", "scorer")
    dog = Watchdog(hub.cfg.run, now=0.0)
    stalls = _stalls(hub, dog, 31.0)
    assert "no generator connected" in str(stalls[0]["why"])


def test_reports_repeat_every_stall_report_s(hub):
    _join(hub, "trainer", "generator", "scorer")
    dog = Watchdog(hub.cfg.run, now=0.0)
    assert len(_stalls(hub, dog, *[float(t) for t in range(0, 95)])) == 3  # 30, 60, 90


def test_a_step_served_resets_the_clock(hub):
    _join(hub, "trainer", "generator", "scorer")
    dog = Watchdog(hub.cfg.run, now=0.0)
    hub.ledger.versions.next_version = 1  # what serving a step does
    assert _stalls(hub, dog, 25.0, 40.0) == []


def test_the_run_stops_after_stall_abort_s_with_the_reason(tmp_path):
    cfg = load_config(None, [f'run.run_dir="{tmp_path}"', "run.stall_abort_s=45"])
    grouper = Grouper(cfg)
    try:
        dog = Watchdog(cfg.run, now=0.0)
        dog.check(31.0, grouper)  # reported, not stopped
        with pytest.raises(StallAbort, match=r"received nothing for 45s.*no trainer connected"):
            dog.check(45.0, grouper)
    finally:
        grouper.server.close()
        close_context(grouper.ctx)


def test_an_agent_run_without_a_scorer_is_not_told_to_start_one(tmp_path):
    agent = 'env.agent="grpo_stream.agents.calc:calc_agent"'  # its generators reward it
    overrides = ['task.name="calc"', agent, "hub.groups_per_step=2"]
    cfg = load_config(None, [f'run.run_dir="{tmp_path}"', *overrides])
    grouper = Grouper(cfg)
    try:
        _join(grouper, "trainer", "generator")  # what `up` starts for an agent
        stalls = _stalls(grouper, Watchdog(cfg.run, now=0.0), 31.0)
        assert len(stalls) == 1 and "scorer" not in str(stalls[0]["why"])
    finally:
        grouper.server.close()
        close_context(grouper.ctx)


def test_a_distillation_run_without_a_teacher_is_named(tmp_path):
    cfg = load_config(None, [f'run.run_dir="{tmp_path}"', 'algo.distill.teacher="x"'])
    grouper = Grouper(cfg)
    try:
        _join(grouper, "trainer", "generator", "scorer")
        dog = Watchdog(grouper.cfg.run, now=0.0)
        _ask(grouper)
        dog.check(1.0, grouper)
        (stall,) = _stalls(grouper, dog, 31.5)
        assert "no teacher connected" in str(stall["why"])
    finally:
        grouper.server.close()
        close_context(grouper.ctx)


def test_no_stall_is_reported_while_every_generator_loads_its_model(hub):
    _join(hub, "trainer", "scorer")
    _join(hub, "generator", loading=True)
    dog = Watchdog(hub.cfg.run, now=0.0)
    _ask(hub)
    assert _stalls(hub, dog, *[float(t) for t in range(0, 95)]) == []


def test_the_clock_starts_when_the_generator_has_loaded(hub):
    _join(hub, "trainer", "scorer")
    _join(hub, "generator", loading=True)
    dog = Watchdog(hub.cfg.run, now=0.0)
    _ask(hub)
    assert _stalls(hub, dog, 10.0, 50.0) == []
    hub.registry.peers["generator-0"].generator = READY  # its heartbeat: the engine is built
    stalls = _stalls(hub, dog, 51.0, 79.0, 82.0)
    assert len(stalls) == 1 and stalls[0]["seconds"] == 32
