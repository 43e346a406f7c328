"""The generator's weight fetch: a weight server that is down, died mid-fetch or refuses is
retried with backoff at the address the hub gives now; the generator keeps running and
applies the version once it is served."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from grpo_stream.config import RunConfig
from grpo_stream.engines import Engine, make_engine
from grpo_stream.runtime import HubLink, StopFlag
from grpo_stream.services.generator import Generator
from grpo_stream.transport.settings import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.transport.sockets import close_context, make_context
from grpo_stream.transport.weights import WeightServer

STALL_S = 1.0  # weights.fetch_stall_s of these tests


@pytest.fixture
def server() -> Iterator[WeightServer]:
    ctx = make_context()
    srv = WeightServer(
        ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", TransportSettings(), SecuritySettings()
    )
    yield srv
    srv.close()
    close_context(ctx)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """The packaged model, loaded once for the module (tens of seconds on a loaded machine)."""
    cfg = RunConfig()
    weights = WeightsSettings(fetch_stall_s=STALL_S)
    made = make_engine(
        "hf", cfg.model, cfg.generator, cfg.transport, SecuritySettings(), "cpu", weights=weights
    )
    yield made
    made.close()


def generator(engine: Engine, weights: str) -> Generator:
    cfg = RunConfig()
    link = HubLink(
        "generator", "g-test", "tcp://127.0.0.1:9", TransportSettings(), SecuritySettings(),
        StopFlag(),
    )  # fmt: skip
    link.cfg = cfg
    link.peers = {"weights": weights}
    return Generator(link, engine, link.stop)


def _publish_next(server: WeightServer, engine: Engine) -> int:
    version = engine.version + 1
    weights: list[tuple[str, Any]] = [
        (n, p.detach().clone() + 0.01) for n, p in engine.model.named_parameters()
    ]
    server.publish(version, weights)
    return version


def _wait_applied(gen: Generator, version: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while gen.engine.version < version and time.monotonic() < deadline:
        gen._ensure_version(version)  # the backoff passes, then it fetches and applies


@pytest.mark.slow
def test_a_refusing_weight_server_is_retried_until_it_serves(
    engine: Engine, server: WeightServer
) -> None:
    gen = generator(engine, server.addresses["weights"])
    held = engine.version
    gen.announced = held + 1  # the trainer announced a version, then its server lost it
    assert not gen._ensure_version(held + 1)  # no weights yet: no crash, retried later
    assert gen.engine.version == held and gen._fetch_failures == 1
    version = _publish_next(server, engine)
    _wait_applied(gen, version, timeout_s=10)
    assert gen.engine.version == version and gen._fetch_failures == 0
    gen.link.close("done")


@pytest.mark.slow
def test_a_server_that_died_is_given_up_and_retried_at_the_hubs_new_address(
    engine: Engine, server: WeightServer
) -> None:
    gen = generator(engine, "tcp://127.0.0.1:9")  # nobody serves there: a killed trainer's
    held = engine.version
    gen.announced = held + 1
    t0 = time.monotonic()
    gen._fetch_weights()
    assert time.monotonic() - t0 < STALL_S + 5  # given up after fetch_stall_s, not 60 s
    assert gen._fetch_failures == 1 and gen.reload
    gen.link.peers["weights"] = server.addresses["weights"]  # the hub's Welcome: restarted
    version = _publish_next(server, engine)
    _wait_applied(gen, version, timeout_s=10)
    assert gen.engine.version == version and gen._fetch_failures == 0
    gen.link.close("done")
