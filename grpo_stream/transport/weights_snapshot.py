"""The weight server's snapshot of one version: tensors copied into reused host buffers,
de-aliased and checksummed (`grpo_stream.transport.weights` chunks and serves it).

Why reuse: copying a set into freshly allocated memory costs a page fault per 4 KiB page
(measured 0.76 GiB/s into fresh memory vs 7.9 GiB/s into touched memory on this project's
CPU machine), so a new 1 GiB snapshot per version spent most of its time faulting.

Invariants:
- A snapshot's arrays are views over one flat buffer of `SnapshotBuffers`. A buffer is
  written again only when nothing but the pool references it: every array, chunk, stream,
  pending step delta and ZeroMQ frame (pyzmq's zero-copy send holds a reference until libzmq
  has released the memory) keeps the buffer's reference count above the pool's own, so a
  buffer still being sent, or held by anyone, is never overwritten; the pool then allocates
  a new one. The pool keeps at most `keep` buffers (the one being served and the next).
- Checksums of a snapshot of `OVERLAP_BYTES` or more are computed on a helper thread while
  the next tensor is copied (xxh3 and the copy both release the GIL); a smaller one is
  hashed inline: there the thread's start and hand-offs cost more than the overlap saves
  (tiny model, 4.9 MB: 1.8 ms inline against 5.0 ms with the thread, median of 30 on this
  project's CPU machine, and more when a generator shares the core).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from grpo_stream.protocols.arrays import from_torch
from grpo_stream.protocols.errors import ProtocolError
from grpo_stream.transport.delta import checksum
from grpo_stream.transport.errors import WeightsError

if TYPE_CHECKING:
    import torch

ALIGN = 64
"""Byte alignment of each tensor inside a snapshot buffer (a cache line; any dtype fits)."""

OVERLAP_BYTES = 64 * 2**20
"""Snapshots at least this large hash on a helper thread, overlapped with the copy."""

Arrays = list[tuple[str, np.ndarray[Any, Any]]]


def _alias_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    storage = tensor.untyped_storage().data_ptr()
    return (storage, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)


def _wire_dtype(tensor: torch.Tensor) -> np.dtype[Any]:
    """The numpy dtype `tensor` travels as: the one protocols.arrays.from_torch gives it."""
    import torch

    try:
        return from_torch(torch.empty(0, dtype=tensor.dtype)).dtype
    except ProtocolError as exc:
        raise WeightsError(f"cannot send tensors of dtype {tensor.dtype}") from exc


def padded(nbytes: int) -> int:
    """`nbytes` rounded up to the next multiple of ALIGN (where the next tensor starts)."""
    return -(-nbytes // ALIGN) * ALIGN


def _unique(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
) -> tuple[list[tuple[str, torch.Tensor]], dict[str, str]]:
    """The tensors to send, each storage view once; tied duplicates as alias -> name sent."""
    unique: list[tuple[str, torch.Tensor]] = []
    seen: dict[tuple[Any, ...], str] = {}
    aliases: dict[str, str] = {}
    for name, tensor in named_tensors:
        key = _alias_key(tensor)
        if key[0] != 0 and key in seen:  # data_ptr 0: empty/meta tensors alias nothing
            aliases[name] = seen[key]
            continue
        seen[key] = name
        unique.append((name, tensor))
    return unique, aliases


class SnapshotBuffers:
    """Flat uint8 host buffers, touched once, reused for later snapshots of the same size."""

    def __init__(self, keep: int = 2) -> None:
        self._keep = keep
        self._buffers: list[np.ndarray[Any, Any]] = []
        self.allocated = 0  # buffers allocated so far (read by tests and stats)

    def take(self, nbytes: int) -> np.ndarray[Any, Any]:
        """A buffer of `nbytes` that nobody else references (reused, or new and touched)."""
        for i in range(len(self._buffers)):
            # references: the list, getrefcount's argument; any view or frame adds one
            if self._buffers[i].nbytes == nbytes and sys.getrefcount(self._buffers[i]) <= 2:
                return self._buffers[i]
        buffer = np.ones(nbytes, dtype=np.uint8)  # written now: its pages fault here, once
        self.allocated += 1
        # buffers of another size (a new layout) or beyond `keep` leave the pool; whoever
        # still holds one keeps it alive until done with it
        self._buffers = [b for b in self._buffers if b.nbytes == nbytes] + [buffer]
        del self._buffers[: -self._keep]
        return buffer


def copy_snapshot(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    buffers: SnapshotBuffers | None = None,
    with_checksums: bool = True,
) -> tuple[Arrays, dict[str, str], tuple[int, ...]]:
    """Copy tensors into one host buffer, skipping tied duplicates; returns (arrays, aliases,
    per-tensor checksums; empty without `with_checksums`). The arrays are views over a buffer
    of `buffers` (or a new one)."""
    import torch

    unique, aliases = _unique(named_tensors)
    sizes = [t.numel() * t.element_size() for _, t in unique]
    total = sum(padded(n) for n in sizes)
    flat = (buffers or SnapshotBuffers(keep=1)).take(max(1, total))
    arrays: Arrays = []
    behind: list[Future[int]] = []  # hashed on the helper thread
    inline: list[int] = []  # hashed here, each right after its copy
    overlap = with_checksums and total >= OVERLAP_BYTES
    # the pool starts its thread at the first submit: none when not overlapping
    with ThreadPoolExecutor(1, thread_name_prefix="weights-checksum") as pool:
        offset = 0
        for (name, tensor), nbytes in zip(unique, sizes, strict=True):
            raw = flat[offset : offset + nbytes]
            offset += padded(nbytes)
            arr = raw.view(_wire_dtype(tensor)).reshape(tuple(tensor.shape))
            if nbytes:
                dst = torch.from_numpy(raw).view(tensor.dtype).view(tensor.shape)
                dst.copy_(tensor.detach())
            arrays.append((name, arr))
            if overlap:
                behind.append(pool.submit(checksum, arr))
            elif with_checksums:
                inline.append(checksum(arr))
        checksums = tuple(f.result() for f in behind) if overlap else tuple(inline)
    return arrays, aliases, checksums
