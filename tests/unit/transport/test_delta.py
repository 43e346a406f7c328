"""XOR+zstd tensor deltas and checksums (grpo_stream.transport.delta)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from grpo_stream.transport.delta import (
    DeltaError,
    apply_delta,
    checksum,
    compose,
    encode_delta,
)

BF16 = np.dtype(ml_dtypes.bfloat16)


def _bf16(rng: np.random.Generator, n: int) -> np.ndarray:
    return (rng.standard_normal(n) * 0.02).astype(np.float32).astype(BF16)


def _nudged(arr: np.ndarray, rng: np.random.Generator, frac: float) -> np.ndarray:
    out = arr.copy()
    bits = out.view(np.uint16)
    idx = rng.random(out.size) < frac
    bits[idx] ^= 1  # one ulp: what a small optimizer step does to a few bf16 elements
    return out


def _base_and_delta(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A random bf16 tensor of `n` elements and the delta to it nudged at 5% of them."""
    rng = np.random.default_rng(seed)
    base = _bf16(rng, n)
    payload = encode_delta(base, _nudged(base, rng, 0.05), level=3)
    assert payload is not None
    return base, payload


def test_delta_applied_to_its_base_gives_the_new_tensor_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    base = _bf16(rng, 100_000)
    new = _nudged(base, rng, 0.03)
    payload = encode_delta(base, new, level=3)
    assert payload is not None and payload.nbytes < new.nbytes / 4
    assert apply_delta(base, payload).tobytes() == new.tobytes()


def test_delta_is_not_sent_when_it_would_be_larger_than_the_tensor() -> None:
    rng = np.random.default_rng(1)
    base = np.zeros(1000, np.uint32)
    new = rng.integers(0, 2**32, size=1000, dtype=np.uint32)  # every bit random
    assert encode_delta(base, new, level=3) is None


def test_delta_between_different_shapes_is_not_made() -> None:
    assert encode_delta(np.zeros(4, np.float32), np.zeros((2, 2), np.float32), 3) is None


def test_truncated_delta_is_refused() -> None:
    base, payload = _base_and_delta(2, 10_000)
    with pytest.raises(DeltaError):
        apply_delta(base, payload[: payload.nbytes // 2])


def test_corrupt_delta_is_refused_by_the_frame_checksum() -> None:
    base, payload = _base_and_delta(3, 10_000)
    bad = payload.copy()
    bad[bad.nbytes // 2] ^= 0xFF
    with pytest.raises(DeltaError):
        apply_delta(base, bad)


def test_delta_against_a_base_of_another_size_is_refused() -> None:
    base, payload = _base_and_delta(4, 1000)
    with pytest.raises(DeltaError):
        apply_delta(base[:500], payload)


def test_composed_steps_equal_the_direct_delta() -> None:
    rng = np.random.default_rng(5)
    v0 = _bf16(rng, 50_000)
    v1 = _nudged(v0, rng, 0.02)
    v2 = _nudged(v1, rng, 0.02)
    steps = [encode_delta(v0, v1, 3), encode_delta(v1, v2, 3)]
    assert all(s is not None for s in steps)
    payload = compose([s for s in steps if s is not None], v0.nbytes, level=3)
    assert apply_delta(v0, payload).tobytes() == v2.tobytes()


def test_checksum_differs_for_one_flipped_bit() -> None:
    arr = np.zeros(1000, np.uint16)
    flipped = arr.copy()
    flipped[500] = 1
    assert checksum(arr) != checksum(flipped)
