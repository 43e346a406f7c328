"""Fixtures of the environment tests: the tiny-guess model in an hf engine, and pools."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.sandbox import EnvPool

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _bad_envs_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))  # workers take sys.path at start()


@pytest.fixture(scope="module")
def engine() -> Any:
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.models.loading import load_policy, load_tokenizer

    name = "grpo-stream/tiny-guess"
    return HFEngine(load_policy(name, dtype="float32", trainable=False), load_tokenizer(name))


@pytest.fixture
def make_pool() -> Iterator[Callable[..., EnvPool]]:
    pools: list[EnvPool] = []

    def factory(name: str, **settings: Any) -> EnvPool:
        pool = EnvPool(EnvSettings(name=name, **{"timeout_s": 1.0, **settings}))
        pool.start()
        pools.append(pool)
        return pool

    yield factory
    for pool in pools:
        pool.close()
