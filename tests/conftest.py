"""Shared test fixtures."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    """A command under test may configure structlog (level filters, outputs); later tests
    must see the defaults, so `capture_logs` captures every level again."""
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


@pytest.fixture(autouse=True)
def _own_sys_path() -> Iterator[None]:
    """Loading user code in process (`usercode.import_object`, as pre-flight does) puts the
    working directory on `sys.path` for the process's life; a test that chdirs to a temporary
    folder must not leave it there for later tests to import its `my_rewards.py` from."""
    saved = list(sys.path)
    yield
    sys.path[:] = saved


@pytest.fixture
def keep_signals() -> Iterator[None]:
    """A service under test installs SIGTERM/SIGINT handlers: put pytest's back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
