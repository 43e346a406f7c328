"""The generator's loop (grpo_stream.services.generator) against a real hub socket and the
packaged tiny model: it pulls prompts with credits and returns one Rollout per prompt; after a
hub restart it drops what it held and asks for its window again; a weight server that is down
refuses or died mid-fetch is retried with backoff at the address the hub gives now, and the
version applied once it is served."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo_stream.config import RunConfig, config_from_dict
from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.engines import Engine, make_engine
from grpo_stream.protocols import messages as m
from grpo_stream.services.generator import Generator
from grpo_stream.transport.sockets import close_context, make_context
from grpo_stream.transport.weights import WeightServer

sys.path.insert(0, str(Path(__file__).parents[1] / "session"))
sys.path.insert(0, str(Path(__file__).parent))
from generator_harness import Serving, connected, prompt_batch
from hub_script import ScriptedHub

pytestmark = pytest.mark.slow  # loads the packaged model: tens of seconds on a loaded machine

STALL_S = 1.0  # weights.fetch_stall_s of these tests


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> RunConfig:
    return config_from_dict(
        {
            "run": {"run_dir": str(tmp_path_factory.mktemp("run"))},
            "generator": {"prompts_per_request": 2, "group_size": 3},
            # a batch that waits for a version waits 3 s before it is generated anyway
            "transport": {"heartbeat_interval_s": 0.1, "heartbeat_timeout_s": 3.0},
        }
    )


@pytest.fixture(scope="module")
def engine(cfg: RunConfig) -> Iterator[Engine]:
    weights = WeightsSettings(fetch_stall_s=STALL_S)
    eng = make_engine(
        "hf", cfg.model, cfg.generator, cfg.transport, SecuritySettings(), "cpu", weights=weights
    )
    yield eng
    eng.close()


@pytest.fixture
def hub(cfg: RunConfig) -> Iterator[ScriptedHub]:
    fake = ScriptedHub(cfg)
    yield fake
    fake.close()


def batch(lease_id: int, min_version: int = 0) -> m.PromptBatch:
    return prompt_batch(lease_id, [5, 6], ["3+4=", "2+2="], 3, 4, min_version)


def test_the_generator_returns_one_rollout_per_prompt_and_asks_for_more(
    hub: ScriptedHub, engine: Engine
) -> None:
    serving = Serving(hub.address, engine)
    try:
        assert hub.wait_for(m.WorkRequest)[0].credits == 4  # type: ignore[attr-defined]
        hub.send("gen-0", batch(lease_id=9))
        rollouts = hub.wait_for(m.Rollout, count=2, timeout_s=60)
        assert sorted(r.group_id for r in rollouts) == [5, 6]  # type: ignore[attr-defined]
        for r in rollouts:
            assert isinstance(r, m.Rollout)
            assert r.lease_id == 9 and r.instance == "gen-0" and r.policy_version == 0
            assert len(r.texts) == 3 and r.completion_offsets[-1] == len(r.completion_ids)
            assert len(r.logprobs) == len(r.completion_ids)
        more = hub.wait_for(m.WorkRequest, count=2)[1]
        assert more.credits == 2  # type: ignore[attr-defined]  # one per prompt generated
    finally:
        serving.close()


def test_after_a_hub_restart_the_generator_drops_what_it_held_and_asks_again(
    hub: ScriptedHub, engine: Engine, cfg: RunConfig
) -> None:
    serving = Serving(hub.address, engine)
    hub.wait_for(m.WorkRequest)
    hub.send("gen-0", batch(lease_id=3, min_version=1))  # waits for a version that never comes
    time.sleep(0.5)
    hub.close()
    again = ScriptedHub(cfg, address=hub.address)
    try:
        assert again.wait_for(m.WorkRequest, timeout_s=30)[0].credits == 4  # type: ignore[attr-defined]
        time.sleep(0.5)
        assert serving.gen is not None and not serving.gen.queue  # the batch was dropped
        time.sleep(4.0)  # past the version wait (3 s): it is not generated
        assert again.of(m.Rollout) == [] and hub.of(m.Rollout) == []
    finally:
        serving.close()
        again.close()


@pytest.fixture
def server() -> Iterator[WeightServer]:
    ctx = make_context()
    srv = WeightServer(
        ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", TransportSettings(), SecuritySettings()
    )
    yield srv
    srv.close()
    close_context(ctx)


def served_and_applied(gen: Generator, engine: Engine, server: WeightServer, want: int) -> None:
    """The server publishes version `want` (the weights nudged); the generator, retrying as
    the hub's next batches would, applies it within 10 s (its backoff after one failure is
    1 s) and its failures reset."""
    weights: list[tuple[str, Any]] = [
        (n, p.detach().clone() + 0.01)
        for n, p in engine.model.named_parameters()  # type: ignore[attr-defined]
    ]
    server.publish(want, weights)
    deadline = time.monotonic() + 10
    while engine.version < want and time.monotonic() < deadline:
        gen._ensure_version(want)
    assert engine.version == want and gen.weights.tracker.failures == 0


def test_a_refusing_weight_server_is_retried_until_it_serves(
    hub: ScriptedHub, engine: Engine, server: WeightServer
) -> None:
    hub.peers = m.Endpoints(weights=server.addresses["weights"], announce="tcp://127.0.0.1:8")
    session = connected(hub.address)
    gen = Generator(session, engine)
    tracker = gen.weights.tracker
    tracker.announced = engine.version + 1  # the trainer announced a version, then lost it
    want = tracker.announced
    assert not gen._ensure_version(want)  # no weights yet: no crash, retried later
    assert tracker.failures == 1
    served_and_applied(gen, engine, server, want)
    session.close("done")


def test_a_server_that_died_is_given_up_and_retried_at_the_hubs_new_address(
    hub: ScriptedHub, engine: Engine, server: WeightServer
) -> None:
    # nobody serves there: a killed trainer's
    hub.peers = m.Endpoints(weights="tcp://127.0.0.1:9", announce="tcp://127.0.0.1:8")
    session = connected(hub.address)
    gen = Generator(session, engine)
    tracker = gen.weights.tracker
    tracker.announced = engine.version + 1
    want = tracker.announced
    t0 = time.monotonic()
    gen.weights.update()
    assert time.monotonic() - t0 < STALL_S + 5  # given up after fetch_stall_s, not 60 s
    assert tracker.failures == 1 and tracker.reload
    # the hub's Welcome: restarted
    gen.link.peers = m.Endpoints(weights=server.addresses["weights"], announce="tcp://127.0.0.1:8")
    served_and_applied(gen, engine, server, want)
    session.close("done")


def test_in_flight_a_version_fetched_meanwhile_is_swapped_in_and_the_oldest_is_the_rollouts(
    engine: Engine, server: WeightServer, cfg: RunConfig
) -> None:
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.hub.guard import check_rollout

    assert isinstance(engine, HFEngine)
    inflight = cfg.model_copy(
        update={"generator": cfg.generator.model_copy(update={"inflight_updates": True})}
    )
    hub = ScriptedHub(inflight)
    hub.peers = m.Endpoints(weights=server.addresses["weights"], announce="tcp://127.0.0.1:8")
    session = connected(hub.address)
    assert session.cfg.generator.inflight_updates
    gen = Generator(session, engine)
    engine.enable_inflight(gen.weights.between_steps)
    try:
        old = engine.version
        weights = [(n, p.detach().clone() + 0.01) for n, p in engine.model.named_parameters()]
        server.publish(old + 1, weights)
        gen.weights.tracker.heard(old + 1)
        gen.weights.update()  # in flight: fetched on a thread, not applied here
        assert engine.version == old and engine.fetch_pending
        assert engine.wait_fetched(30)
        gen._generate(batch(lease_id=4))  # the first step boundary swaps it in
        assert engine.version == old + 1
        for r in hub.wait_for(m.Rollout, count=2, timeout_s=30):
            assert isinstance(r, m.Rollout) and check_rollout(r, 3) is None
            assert r.policy_version == old  # the oldest token's version
            assert list(r.token_versions[:2]) == [old, old + 1]
    finally:
        engine.enable_inflight(None)
        session.close("done")
        hub.close()
