"""Staging buffers of a fetcher: laid out like the held version, never the held memory."""

from __future__ import annotations

import numpy as np

from grpo_stream.transport.fetch_buffers import StagingBuffers, place


def _stage(staging: StagingBuffers, named: list[tuple[str, np.ndarray]]) -> list:
    staging.begin()
    out = [(n, place(a, staging.slot(n, a.nbytes))) for n, a in named]
    staging.end()
    return out


def test_nothing_is_staged_before_a_layout_is_known() -> None:
    staging = StagingBuffers()
    staging.begin()
    assert staging.slot("w", 16) is None


def test_a_name_or_size_the_layout_does_not_know_keeps_its_own_memory() -> None:
    staging = StagingBuffers()
    staging.learn([("w", np.zeros(4, np.float32))])
    staging.begin()
    assert staging.slot("w", 8) is None
    assert staging.slot("other", 16) is None
    assert staging.slot("w", 16) is not None


def test_the_next_version_is_staged_outside_the_held_one_and_exact() -> None:
    staging = StagingBuffers()
    v1 = [("a", np.arange(5, dtype=np.float32)), ("b", np.ones((2, 3), np.int16))]
    staging.learn(v1)
    held = _stage(staging, v1)
    staging.learn(held)
    v2 = [("a", np.arange(5, dtype=np.float32) * 2), ("b", np.full((2, 3), 7, np.int16))]
    nxt = _stage(staging, v2)
    for (_, got), (_, want), (_, old) in zip(nxt, v2, held, strict=True):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        assert not np.shares_memory(got, old)
    assert held[0][1].tobytes() == v1[0][1].tobytes()  # the held version is untouched
