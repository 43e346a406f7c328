"""Device -> host staging of the weights the trainer publishes.

On a GPU the weights are copied, chunk by chunk, into one host buffer that is allocated
once (pinned, so the copies are DMA transfers that do not block the CPU) and reused for
every version: the copies of chunk k+1 are issued before chunk k is handed on, so the
weight server's own host copy of chunk k (transport/weights.py) overlaps the transfer of
the next. On the CPU there is nothing to stage and the tensors pass through.

Invariants: the staged tensors hold the values, dtypes and shapes of the originals; tied
tensors (one storage under two names) stay one staged tensor, so the server still sends
them once; a staged tensor is valid until the next `stage` call (the buffer is reused), so
the consumer copies it before publishing the next version (the weight server does).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

ALIGN = 64  # bytes: every staged tensor starts aligned for any dtype's view
Named = tuple[str, torch.Tensor]


class CudaCopies:
    """torch.cuda where staging meets it (tests replace it: no GPU on CPU hosts)."""

    def pinned(self, nbytes: int) -> torch.Tensor:
        """A page-locked host buffer of `nbytes` bytes."""
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def on_device(self, tensor: torch.Tensor) -> bool:
        """Its copy to the host can run asynchronously (a CUDA tensor)."""
        return tensor.is_cuda

    def recorded_event(self) -> Any:
        """An event recorded on the current stream after the copies issued so far."""
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        return event


def _key(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class HostStaging:
    """One reusable host buffer for the device -> host copies of published weights."""

    def __init__(
        self, pin: bool, chunk_bytes: int = 64 << 20, cuda: CudaCopies | None = None
    ) -> None:
        self.pin = pin
        self.chunk_bytes = chunk_bytes
        self.cuda = CudaCopies() if cuda is None else cuda
        self.buffer: torch.Tensor | None = None  # (capacity,) uint8, grown when too small

    def _reserve(self, nbytes: int) -> torch.Tensor:
        if self.buffer is None or self.buffer.numel() < nbytes:
            size = max(nbytes, 1)
            self.buffer = (
                self.cuda.pinned(size) if self.pin else torch.empty(size, dtype=torch.uint8)
            )
        return self.buffer

    def stage(self, named: Iterable[Named]) -> Iterator[Named]:
        """The same (name, tensor) pairs with every tensor in the host buffer."""
        items = list(named)
        offsets: dict[tuple[Any, ...], int] = {}
        total = 0
        for _, t in items:
            if _key(t) not in offsets:
                offsets[_key(t)] = total
                total += -(-_nbytes(t) // ALIGN) * ALIGN
        buffer = self._reserve(total)
        chunks = self._chunks(items)
        views: dict[tuple[Any, ...], torch.Tensor] = {}
        pending = self._issue(chunks[0] if chunks else [], buffer, offsets, views)
        for k, chunk in enumerate(chunks):
            ready = pending
            nxt = chunks[k + 1] if k + 1 < len(chunks) else []
            pending = self._issue(nxt, buffer, offsets, views)  # in flight while k is used
            if ready is not None:
                ready.synchronize()
            for name, t in chunk:
                yield name, views[_key(t)]

    def _chunks(self, items: list[Named]) -> list[list[Named]]:
        chunks: list[list[Named]] = []
        size = self.chunk_bytes
        for item in items:
            if size >= self.chunk_bytes:
                chunks.append([])
                size = 0
            chunks[-1].append(item)
            size += _nbytes(item[1])
        return chunks

    def _issue(
        self,
        chunk: list[Named],
        buffer: torch.Tensor,
        offsets: dict[tuple[Any, ...], int],
        views: dict[tuple[Any, ...], torch.Tensor],
    ) -> Any:
        """Start the copies of `chunk` (non-blocking from a GPU); returns the CUDA event
        that marks them done, or None when they already are."""
        on_gpu = False
        for _, t in chunk:
            key = _key(t)
            if key in views:
                continue
            start = offsets[key]
            view = buffer[start : start + _nbytes(t)].view(t.dtype).view(t.shape)
            device = self.pin and self.cuda.on_device(t)
            view.copy_(t.detach(), non_blocking=device)
            views[key] = view
            on_gpu = on_gpu or device
        return self.cuda.recorded_event() if on_gpu else None
