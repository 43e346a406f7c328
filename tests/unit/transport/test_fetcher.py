"""The fetcher both engines use, against a real weight server under the run's secret: given
the secret, it gets the weights and the relay it starts is named to the next fetcher;
without it, it gets no weights at all."""

from __future__ import annotations

import pytest
import torch
from structlog.testing import capture_logs

from grpo_stream.config.transport import SecuritySettings, WeightsSettings
from grpo_stream.transport.errors import WeightsError
from grpo_stream.transport.fetch import Replica
from grpo_stream.transport.fetcher import VersionFetcher
from grpo_stream.transport.sockets import Context
from grpo_stream.transport.weights import WeightServer

from .test_relay import LOCAL, SETTINGS, _fetch, _holds, _set

SECRET = b"f" * 64
RELAYING = WeightsSettings(relay=True, relay_bind=LOCAL, relay_stall_s=1.0)


def _server(ctx: Context) -> WeightServer:
    weights = WeightsSettings(relay=True, fanout=1, relay_stall_s=1.0)
    return WeightServer(ctx, LOCAL, LOCAL, SETTINGS, SecuritySettings(), weights, secret=SECRET)


def test_with_the_runs_secret_the_version_held_is_relayed(ctx: Context) -> None:
    server = _server(ctx)
    fetcher = VersionFetcher(SETTINGS, SecuritySettings(), RELAYING, secret=SECRET)
    try:
        named = _set(1)
        server.publish(1, named)
        got, arrays = fetcher.fetch(server.addresses["weights"])
        assert got == 1 and fetcher.fetches == 1
        assert [name for name, _ in arrays] == [name for name, _ in named]
        relay = fetcher.relay
        assert relay is not None
        other = Replica()
        assert _fetch(ctx, server.addresses["weights"], None, other, SECRET) == 1
        assert server.redirects == 1 and relay.served == 1 and server.served == 1
        assert _holds(other, named)
    finally:
        fetcher.close()
        server.close()


def test_without_the_secret_it_gets_no_weights(ctx: Context) -> None:
    server = _server(ctx)
    fetcher = VersionFetcher(SETTINGS, SecuritySettings(), RELAYING)
    try:
        server.publish(1, _set(1))
        with capture_logs() as logs, pytest.raises(WeightsError, match="unauthorized"):
            fetcher.fetch(server.addresses["weights"])
        assert any(e["event"] == "weights.refused_fetch" for e in logs)
        assert server.served == 0 and server.sent_bytes == 0
    finally:
        fetcher.close()
        server.close()


def test_after_forget_the_next_fetch_still_brings_the_whole_version(ctx: Context) -> None:
    """forget (vLLM refused an update) drops the delta base: the next fetch must not build
    on it, and brings every tensor of the newest version."""
    server = _server(ctx)
    fetcher = VersionFetcher(SETTINGS, SecuritySettings(), WeightsSettings(), secret=SECRET)
    try:
        server.publish(1, _set(1))
        assert fetcher.fetch(server.addresses["weights"])[0] == 1
        fetcher.forget()
        named = _set(2)
        server.publish(2, named)
        got, arrays = fetcher.fetch(server.addresses["weights"])
        assert got == 2 and fetcher.fetches == 2
        sent = dict(named)
        assert sorted(n for n, _ in arrays) == sorted(sent)
        assert all(torch.equal(torch.from_numpy(a.copy()), sent[n]) for n, a in arrays)
    finally:
        fetcher.close()
        server.close()
