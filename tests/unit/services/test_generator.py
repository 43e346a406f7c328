"""The generator's weight fetch: a weight server that is down or refuses is retried with
backoff; the generator keeps running and applies the version once it is served."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from grpo_stream.config import RunConfig
from grpo_stream.engines import make_engine
from grpo_stream.runtime import HubLink, StopFlag
from grpo_stream.services.generator import Generator
from grpo_stream.transport.settings import SecuritySettings, TransportSettings
from grpo_stream.transport.sockets import close_context, make_context
from grpo_stream.transport.weights import WeightServer


@pytest.fixture
def server() -> Iterator[WeightServer]:
    ctx = make_context()
    srv = WeightServer(
        ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", TransportSettings(), SecuritySettings()
    )
    yield srv
    srv.close()
    close_context(ctx)


def generator(weights: str) -> Generator:
    cfg = RunConfig()
    link = HubLink(
        "generator", "g-test", "tcp://127.0.0.1:9", TransportSettings(), SecuritySettings(),
        StopFlag(),
    )  # fmt: skip
    link.cfg = cfg
    link.peers = {"weights": weights}
    engine = make_engine("hf", cfg.model, cfg.generator, cfg.transport, SecuritySettings(), "cpu")
    return Generator(link, engine, link.stop)


@pytest.mark.slow  # loads the packaged model: tens of seconds on a loaded machine
def test_a_refusing_weight_server_is_retried_until_it_serves(server: WeightServer) -> None:
    gen = generator(server.addresses["weights"])
    gen.announced = 1  # the trainer announced version 1, then its server lost it
    assert not gen._ensure_version(1)  # no weights yet: no crash, retried later
    assert gen.engine.version == 0 and gen._fetch_failures == 1
    weights: list[tuple[str, Any]] = [
        (n, p.detach().clone() + 0.01) for n, p in gen.engine.model.named_parameters()
    ]
    server.publish(1, weights)
    deadline = time.monotonic() + 10
    while gen.engine.version < 1 and time.monotonic() < deadline:
        gen._ensure_version(1)  # the backoff (1 s after one failure) passes, then it applies
    assert gen.engine.version == 1 and gen._fetch_failures == 0
    gen.engine.close()
    gen.link.close("done")
