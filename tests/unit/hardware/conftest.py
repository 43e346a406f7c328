"""Fixtures for the hardware tests: NVML replaced at its boundary by recorded answers."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from grpo_stream.hardware.recorded import RecordedNvml, load_record

ALL = ["h100-sxm", "a100-40gb-sxm", "l4", "rtx-4090", "t4"]


@pytest.fixture
def record() -> Callable[[str], dict[str, Any]]:
    """A fresh (mutable) copy of a recorded device's raw NVML answers."""
    return lambda name: copy.deepcopy(load_record(name))


@pytest.fixture
def fake_nvml() -> Callable[..., RecordedNvml]:
    """Build a pynvml stand-in answering from recordings: fake_nvml("h100-sxm", "l4")."""

    def build(*names: str, init_error: str | None = None) -> RecordedNvml:
        return RecordedNvml([load_record(n) for n in names], init_error=init_error)

    return build
