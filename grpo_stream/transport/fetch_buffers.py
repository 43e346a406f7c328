"""Where a fetcher reconstructs a version: slots in a reused, pre-faulted host buffer laid
out like the version it holds (`grpo_stream.transport.fetch` stages into it).

Why: keeping each received ZeroMQ frame as the tensor's memory means libzmq allocates fresh
memory for every version (a page fault per 4 KiB, the receiver's main cost). Copying each
tensor out of its frame into a buffer touched before (then dropping the frame, whose memory
malloc hands to the next frame) costs one cache-warm copy instead.

Invariants:
- The staging buffer never is the one the held version (the delta base) lives in, nor one
  anybody still references: `SnapshotBuffers` hands out only buffers referenced by nobody
  but itself. The held version and the one being staged: two copies of the set at most.
- Staged arrays are writable (so engines take them without another copy); the checksums
  still guard the base: a delta against a base written to since fails its check.
- A tensor whose name or size the layout does not know (the first fetch, a changed model)
  is kept in its own memory (the frame, or a new array): slower, never wrong.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grpo_stream.transport.weights_snapshot import SnapshotBuffers, padded

Arrays = list[tuple[str, np.ndarray[Any, Any]]]


class StagingBuffers:
    """The layout of the version held, and a free buffer of that layout per fetch."""

    def __init__(self) -> None:
        self._pool = SnapshotBuffers(keep=2)
        self._layout: dict[str, tuple[int, int]] = {}  # name -> (offset, bytes)
        self._size = 0
        self._flat: np.ndarray[Any, Any] | None = None

    def begin(self) -> None:
        """Take a free buffer for the next version (none before a layout is known)."""
        self._flat = self._pool.take(self._size) if self._size else None

    def slot(self, name: str, nbytes: int) -> np.ndarray[Any, Any] | None:
        """The uint8 slot for tensor `name` of `nbytes` bytes (None: keep its own memory)."""
        where = self._layout.get(name)
        if self._flat is None or where is None or where[1] != nbytes:
            return None
        return self._flat[where[0] : where[0] + nbytes]

    def end(self) -> None:
        """Forget the buffer taken (the staged arrays keep it alive while they are held)."""
        self._flat = None

    def learn(self, named: Arrays) -> None:
        """Lay the next version out like `named` (the version just swapped in)."""
        layout: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, arr in named:
            layout[name] = (offset, arr.nbytes)
            offset += padded(arr.nbytes)
        self._layout, self._size = layout, offset


def place(arr: np.ndarray[Any, Any], slot: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
    """`arr` copied into `slot` (a view of the slot with arr's dtype and shape); `arr` when
    there is no slot."""
    if slot is None:
        return arr
    out: np.ndarray[Any, Any] = slot.view(arr.dtype).reshape(arr.shape)
    np.copyto(out, arr)
    return out


def target(
    base: np.ndarray[Any, Any], slot: np.ndarray[Any, Any] | None
) -> np.ndarray[Any, Any] | None:
    """The slot as an array like `base` (where a delta against `base` is written), or None."""
    return None if slot is None else slot.view(base.dtype).reshape(base.shape)
