"""Snapshot buffers: reused only once nothing else references them; copies stay exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_stream.transport.delta import checksum
from grpo_stream.transport.errors import WeightsError
from grpo_stream.transport.weights_snapshot import SnapshotBuffers, copy_snapshot


def _named(value: float) -> list[tuple[str, torch.Tensor]]:
    emb = torch.full((7, 5), value, dtype=torch.bfloat16)
    return [
        ("emb", emb),
        ("w", torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * value),  # strided
        ("scalar", torch.tensor(value)),
        ("empty", torch.empty(0, 3)),
        ("lm_head", emb),  # tied: sent once
    ]


def test_copy_is_bit_exact_with_checksums_and_aliases() -> None:
    named = _named(1.5)
    arrays, aliases, sums = copy_snapshot(named, SnapshotBuffers())
    assert aliases == {"lm_head": "emb"}
    assert [n for n, _ in arrays] == ["emb", "w", "scalar", "empty"]
    for (name, arr), (_, tensor) in zip(arrays, named, strict=False):
        want = tensor.contiguous()
        want = want.view(torch.int16) if want.dtype == torch.bfloat16 else want
        got = arr.view(np.int16) if tensor.dtype == torch.bfloat16 else arr
        assert got.shape == tuple(tensor.shape), name
        assert got.tobytes() == want.numpy().tobytes(), name
    assert list(sums) == [checksum(a) for _, a in arrays]


@pytest.mark.parametrize("overlap_bytes", [0, 2**40])
def test_checksums_match_overlapped_or_inline(
    overlap_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hashed on the helper thread (every snapshot at 0) or inline (none at 2**40): the same
    per-tensor checksums, of the copied bytes."""
    from grpo_stream.transport import weights_snapshot

    monkeypatch.setattr(weights_snapshot, "OVERLAP_BYTES", overlap_bytes)
    arrays, _, sums = copy_snapshot(_named(2.5), SnapshotBuffers())
    assert len(sums) == len(arrays) == 4
    assert list(sums) == [checksum(a) for _, a in arrays]
    assert len(set(sums[:2])) == 2  # different tensors, different sums


def test_without_checksums_the_copy_is_the_same() -> None:
    arrays, aliases, sums = copy_snapshot(_named(1.5), SnapshotBuffers(), with_checksums=False)
    want, want_aliases, _ = copy_snapshot(_named(1.5), SnapshotBuffers())
    assert sums == () and aliases == want_aliases
    assert [a.tobytes() for _, a in arrays] == [a.tobytes() for _, a in want]


def test_a_buffer_is_reused_once_its_snapshot_is_dropped() -> None:
    pool = SnapshotBuffers()
    first, _, _ = copy_snapshot(_named(1.0), pool)
    second, _, _ = copy_snapshot(_named(2.0), pool)  # the first is still held: a new buffer
    assert pool.allocated == 2
    assert float(first[0][1].astype(np.float32)[0, 0]) == 1.0  # not overwritten
    del first
    third, _, _ = copy_snapshot(_named(3.0), pool)
    assert pool.allocated == 2
    assert float(second[1][1][0, 0]) == 0.0 and float(second[1][1][1, 0]) == 2.0
    assert float(third[0][1].astype(np.float32)[0, 0]) == 3.0


def test_a_buffer_a_frame_still_holds_is_not_overwritten() -> None:
    pool = SnapshotBuffers()
    arrays, _, _ = copy_snapshot(_named(1.0), pool)
    frame = memoryview(arrays[1][1])  # as pyzmq's zero-copy send holds it until sent
    del arrays
    for value in (2.0, 4.0):  # both into a second buffer, the held one left alone
        copy_snapshot(_named(value), pool)
    assert pool.allocated == 2
    assert np.asarray(frame)[1, 0] == 1.0


def test_a_dtype_that_cannot_travel_is_refused_as_a_weights_error() -> None:
    fp8 = torch.zeros(4, dtype=torch.float8_e4m3fn)  # from_torch has no wire dtype for it
    with pytest.raises(WeightsError, match="float8_e4m3fn"):
        copy_snapshot([("w", fp8)], SnapshotBuffers())
