"""Sparse weight deltas and checksums, both sides of the wire.

A tensor of version v travels either raw (its bytes) or as `xor_zstd`: the XOR of its bits
with the same tensor of a base version b, compressed as one zstd frame (content size and
zstd's own content checksum written). Between two optimizer steps at a small learning rate
most elements of a bf16 tensor keep all their bits (the update is below half an ulp), so the
XOR is mostly zero bytes and compresses to a few percent. XOR deltas compose: the delta b -> v
is the XOR of the deltas b -> b+1, ..., v-1 -> v, which is how a server builds deltas for a
fetcher that skipped versions without holding old versions in full.

Checksums are xxh3-64 of a tensor's bytes; a version's checksum is xxh3-64 of its tensors'
checksums in order. A receiver checks every reconstructed tensor against the sender's
checksum, so a delta applied to the wrong base never passes.

Invariants: `apply_delta` either returns an array (new, or the `out` given) with the base's
dtype and shape or
raises DeltaError (corrupt or truncated frame, wrong decompressed size); it never writes into
the base. Nothing here keeps state.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xxhash
import zstandard

RAW = "raw"
"""Encoding of a tensor sent as its bytes."""
XOR_ZSTD = "xor_zstd"
"""Encoding of a tensor sent as zstd(bits XOR base bits), a uint8 array."""
ENCODINGS = (RAW, XOR_ZSTD)


class DeltaError(ValueError):
    """A delta cannot be applied: corrupt, truncated, or not matching its base."""


def _bytes(arr: np.ndarray[Any, Any]) -> memoryview:
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr.reshape(-1).view(np.uint8).data


def checksum(arr: np.ndarray[Any, Any]) -> int:
    """xxh3-64 of the array's bytes (C order)."""
    return int(xxhash.xxh3_64_intdigest(_bytes(arr)))


def version_checksum(checksums: list[int]) -> int:
    """xxh3-64 of a version's tensor checksums in order."""
    return int(xxhash.xxh3_64_intdigest(np.asarray(checksums, dtype="<u8").tobytes()))


def _words(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The array's bytes as the widest unsigned words that divide its size (for fast XOR)."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    for width in (8, 4, 2):
        if flat.nbytes % width == 0:
            return flat.view(f"<u{width}")
    return flat


def xor_bits(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A new uint8 array: the bitwise XOR of two arrays' bytes (same size)."""
    out: np.ndarray[Any, Any] = np.bitwise_xor(_words(a), _words(b))
    return out.view(np.uint8)


def compress(data: np.ndarray[Any, Any], level: int) -> np.ndarray[Any, Any]:
    """One zstd frame (content size and checksum written) of the array's bytes, as uint8."""
    comp = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    return np.frombuffer(comp.compress(_bytes(data)), dtype=np.uint8)


def decompress(payload: np.ndarray[Any, Any], nbytes: int) -> np.ndarray[Any, Any]:
    """The `nbytes` bytes in a zstd frame, as uint8; raises DeltaError otherwise."""
    try:
        params = zstandard.get_frame_parameters(_bytes(payload))
        if params.content_size != nbytes:
            raise DeltaError(f"delta holds {params.content_size} bytes, the base has {nbytes}")
        out = zstandard.ZstdDecompressor().decompress(_bytes(payload), max_output_size=nbytes)
    except zstandard.ZstdError as exc:
        raise DeltaError(f"corrupt or truncated delta: {exc}") from None
    if len(out) != nbytes:
        raise DeltaError(f"delta decompressed to {len(out)} bytes, the base has {nbytes}")
    return np.frombuffer(out, dtype=np.uint8)


def encode_delta(
    base: np.ndarray[Any, Any], new: np.ndarray[Any, Any], level: int
) -> np.ndarray[Any, Any] | None:
    """zstd(new XOR base) when the two are alike (dtype, shape) and that is smaller than `new`."""
    if base.dtype != new.dtype or base.shape != new.shape or new.nbytes == 0:
        return None
    payload = compress(xor_bits(base, new), level)
    return payload if payload.nbytes < new.nbytes else None


def apply_delta(
    base: np.ndarray[Any, Any],
    payload: np.ndarray[Any, Any],
    out: np.ndarray[Any, Any] | None = None,
) -> np.ndarray[Any, Any]:
    """`base` with the XOR in the zstd `payload` applied (dtype, shape of base), written into
    `out` (an array like base, not base itself) or a new array."""
    bits = decompress(payload, base.nbytes)
    if out is None:
        out = np.empty(base.shape, dtype=base.dtype)
    np.bitwise_xor(_words(base), _words(bits), out=_words(out))
    return out


def compose(payloads: list[np.ndarray[Any, Any]], nbytes: int, level: int) -> np.ndarray[Any, Any]:
    """One zstd XOR payload equal to applying `payloads` (each over `nbytes` bytes) in turn."""
    acc = decompress(payloads[0], nbytes).copy()
    words = _words(acc)
    for payload in payloads[1:]:
        np.bitwise_xor(words, _words(decompress(payload, nbytes)), out=words)
    return compress(acc, level)
