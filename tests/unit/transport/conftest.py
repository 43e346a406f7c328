"""Fixtures for transport tests: a ZeroMQ context and settings with short timeouts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.transport.sockets import Context, close_context, make_context


@pytest.fixture
def ctx() -> Iterator[Context]:
    context = make_context()
    yield context
    close_context(context)


@pytest.fixture
def settings() -> TransportSettings:
    return TransportSettings(io_timeout_ms=2000, heartbeat_interval_s=0.05, heartbeat_timeout_s=0.3)


@pytest.fixture
def plain() -> SecuritySettings:
    return SecuritySettings()
