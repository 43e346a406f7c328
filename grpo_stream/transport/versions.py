"""What the weight server holds per version: the full snapshot, and the step deltas of the
last `weights.delta_window` versions from which it builds the delta a fetcher needs.

Invariants:
- A `Snapshot` is immutable once built; its chunks and arrays are shared by every stream.
- `DeltaHistory` holds, per recorded step a -> b, one zstd XOR payload per tensor (None where
  the tensor changed dtype/shape/name or its delta was not smaller than the tensor): bounded
  by `delta_window` steps, each a fraction of the full size at small learning rates.
- The delta chunks for a base b are the composition of the steps b -> ... -> current; a
  tensor with a missing step travels raw. They are built once per base and version (cached
  until the next publish) and carry the same per-tensor checksums as the full snapshot.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grpo_stream.config.transport import TransportSettings
from grpo_stream.protocols.codec import encode
from grpo_stream.protocols.messages import WeightsChunk
from grpo_stream.transport.delta import RAW, XOR_ZSTD, compose, encode_delta
from grpo_stream.transport.errors import WeightsError

Arrays = list[tuple[str, np.ndarray[Any, Any]]]


@dataclass(frozen=True)
class Snapshot:
    """One complete weights version, chunked and ready to send."""

    version: int
    chunks: tuple[WeightsChunk, ...]
    num_tensors: int
    total_bytes: int
    aliases: dict[str, str] = field(default_factory=dict)  # skipped name -> name sent
    arrays: Arrays = field(default_factory=list)
    checksums: tuple[int, ...] = ()
    checksum: int = 0


def chunk_bounds(sizes: list[int], chunk_bytes: int) -> list[tuple[int, int]]:
    """Greedy [start, end) ranges of about chunk_bytes; at least one (possibly empty) range."""
    bounds: list[tuple[int, int]] = []
    start, acc = 0, 0
    for i, size in enumerate(sizes):
        if i > start and acc + size > chunk_bytes:
            bounds.append((start, i))
            start, acc = i, 0
        acc += size
    bounds.append((start, len(sizes)))
    return bounds


@dataclass(frozen=True)
class Payload:
    """What travels for one tensor: the array and its encoding."""

    name: str
    array: np.ndarray[Any, Any]
    encoding: str


def make_chunks(
    version: int,
    base: int,
    payloads: list[Payload],
    checksums: tuple[int, ...],
    checksum: int,
    settings: TransportSettings,
) -> tuple[WeightsChunk, ...]:
    """Chunk one version's payloads; raises WeightsError for a chunk over the message limit."""
    bounds = chunk_bounds([p.array.nbytes for p in payloads], settings.weights_chunk_bytes)
    chunks = []
    for index, (lo, hi) in enumerate(bounds):
        part = payloads[lo:hi]
        chunk = WeightsChunk(
            version=version,
            index=index,
            count=len(bounds),
            names=[p.name for p in part],
            tensors=[p.array for p in part],
            base=base,
            encodings=[p.encoding for p in part],
            checksums=list(checksums[lo:hi]),
            checksum=checksum,
        )
        size = sum(memoryview(f).nbytes for f in encode(chunk))
        if size > settings.max_message_bytes:
            raise WeightsError(
                f"weights chunk {index} of version {version} has {size} bytes, over "
                f"transport.max_message_bytes={settings.max_message_bytes}"
            )
        chunks.append(chunk)
    return tuple(chunks)


@dataclass(frozen=True)
class _Step:
    """The XOR payloads from version `start` to version `end`, by tensor name."""

    start: int
    end: int
    payloads: dict[str, np.ndarray[Any, Any] | None]


PROBE_EVERY = 16
"""After a step delta over `weights.delta_max_ratio` of the full set, deltas are tried again
only at every this many publishes (the ones between are sent in full, nothing computed)."""


class DeltaHistory:
    """Step deltas of the last `window` versions; builds delta chunk sets per base."""

    def __init__(
        self, window: int, level: int, settings: TransportSettings, max_ratio: float = 1.0
    ) -> None:
        self._steps: deque[_Step] = deque(maxlen=window)
        self._level = level
        self._settings = settings
        self._max_ratio = max_ratio
        self._skip = 0  # publishes still to send in full without a delta (see `_record`)
        self._built: dict[int, tuple[WeightsChunk, ...] | None] = {}
        self._built_for = -1
        self.wire_bytes: dict[int, int] = {}  # base -> bytes of its delta chunks (stats)
        self._pending: list[tuple[Snapshot, Snapshot]] = []  # deferred steps, oldest first
        self._mutex = threading.RLock()  # defer runs on the trainer's thread, the rest on
        # the server's: the step deltas are computed (XOR + zstd, both free of the GIL) by
        # whichever thread needs them first, never on the trainer's step path

    def defer(self, prev: Snapshot | None, new: Snapshot) -> None:
        """Note the step prev -> new; its delta is computed by `settle` (or on first use)."""
        with self._mutex:
            self._built.clear()
            self.wire_bytes.clear()
            if prev is not None and self._skip > 0:
                self._skip -= 1  # deltas did not pay lately: no chain, the full set goes
                self._steps.clear()
            elif prev is not None:
                self._pending.append((prev, new))

    def settle(self) -> None:
        """Compute every deferred step delta (the weight server's thread calls this when idle)."""
        with self._mutex:
            while self._pending:
                prev, new = self._pending.pop(0)
                self._record(prev, new)

    def record(self, prev: Snapshot | None, new: Snapshot) -> None:
        """Compute and keep the step prev -> new (nothing to record for the first version)."""
        with self._mutex:
            self.defer(prev, new)
            self.settle()

    def _record(self, prev: Snapshot, new: Snapshot) -> None:
        if self._steps and self._steps[-1].end != prev.version:
            self._steps.clear()  # a chain that does not lead to prev is of no use
        old = dict(prev.arrays)
        payloads: dict[str, np.ndarray[Any, Any] | None] = {}
        for name, arr in new.arrays:
            base = old.get(name)
            payloads[name] = None if base is None else encode_delta(base, arr, self._level)
        wire = sum(arr.nbytes if (p := payloads[n]) is None else p.nbytes for n, arr in new.arrays)
        if wire > self._max_ratio * max(new.total_bytes, 1):
            # not worth its encode and decode (fp32 weights: nearly every element changes its
            # low bytes): this and the next PROBE_EVERY - 1 publishes go in full, uncomputed
            self._steps.clear()
            self._skip = PROBE_EVERY - 1
            return
        self._steps.append(_Step(prev.version, new.version, payloads))

    def bases(self) -> list[int]:
        """The versions a fetcher may hold and get a delta for."""
        self.settle()
        return [step.start for step in self._steps]

    def chunks_from(self, have: int, current: Snapshot) -> tuple[WeightsChunk, ...] | None:
        """The delta chunks from `have` to `current` (None: no chain from `have`)."""
        with self._mutex:
            self.settle()
            return self._chunks_from(have, current)

    def _chunks_from(self, have: int, current: Snapshot) -> tuple[WeightsChunk, ...] | None:
        if self._built_for != current.version:
            self._built.clear()
            self._built_for = current.version
        if have not in self._built:
            self._built[have] = self._build(have, current)
            chunks = self._built[have]
            if chunks is not None:
                self.wire_bytes[have] = sum(int(t.nbytes) for c in chunks for t in c.tensors)
        return self._built[have]

    def _build(self, have: int, current: Snapshot) -> tuple[WeightsChunk, ...] | None:
        steps = list(self._steps)
        starts = [s.start for s in steps]
        if have not in starts or not steps or steps[-1].end != current.version:
            return None
        chain = steps[starts.index(have) :]
        payloads = []
        for name, arr in current.arrays:
            parts = [step.payloads.get(name) for step in chain]
            payload = None
            if all(p is not None for p in parts):
                present = [p for p in parts if p is not None]
                payload = (
                    present[0] if len(present) == 1 else compose(present, arr.nbytes, self._level)
                )
            if payload is None or payload.nbytes >= arr.nbytes:
                payloads.append(Payload(name, arr, RAW))
            else:
                payloads.append(Payload(name, payload, XOR_ZSTD))
        return make_chunks(
            current.version, have, payloads, current.checksums, current.checksum, self._settings
        )
