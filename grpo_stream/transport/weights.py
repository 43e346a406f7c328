"""The trainer's weight server (ZeroMQ, no NCCL); generators fetch from it with
`grpo_stream.transport.fetch`.

Invariants:
- A version is never half-served. `WeightServer.publish` copies every tensor to contiguous CPU
  memory, chunks the copy, swaps the finished snapshot in under a lock and only THEN announces
  WeightsAnnounce on PUB. A fetch in progress keeps streaming the snapshot it started on, even
  if a newer version is published meanwhile, so a fetched set is always all of one version.
- Only the newest snapshot is held. A WeightsRequest for version -1, the current version, an
  older one or a future one is answered with the current snapshot (the fetcher sees which
  version it got); with nothing published yet the answer is Error(code="no_weights").
- A tensor that shares storage (same data, offset, shape, strides, dtype) with an earlier one
  (tied embeddings) is sent once, under the earlier name; the receiver's model re-ties it.
- Chunks go out without copies and without blocking: a peer whose queue is at the HWM is
  resumed later from where it stopped. Memory: the current snapshot, plus older ones only
  while some peer is still being streamed one.
- The ROUTER lives in a background thread that creates it; the PUB socket is used only by
  `publish` (serialised by a lock).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import structlog

from grpo_stream.protocols.codec import encode
from grpo_stream.protocols.messages import (
    Error,
    Message,
    WeightsAnnounce,
    WeightsChunk,
    WeightsRequest,
)
from grpo_stream.transport.errors import TransportError, WeightsError
from grpo_stream.transport.settings import SecuritySettings, TransportSettings
from grpo_stream.transport.sockets import (
    Announcer,
    Context,
    SendStatus,
    Server,
)

if TYPE_CHECKING:
    import torch

log = structlog.get_logger()

IDLE_POLL_MS = 100
"""Receive timeout of the serving loop when no stream is pending (also its stop latency)."""
BUSY_POLL_MS = 5
"""Receive timeout while some peer's stream waits for room under its HWM."""


@dataclass(frozen=True)
class Snapshot:
    """One complete weights version, chunked and ready to send."""

    version: int
    chunks: tuple[WeightsChunk, ...]
    num_tensors: int
    total_bytes: int
    aliases: dict[str, str] = field(default_factory=dict)  # skipped name -> name sent


@dataclass
class _Stream:
    """Where one peer's transfer stands; it keeps its snapshot alive until done."""

    snapshot: Snapshot
    next_index: int = 0


def _to_numpy(tensor: torch.Tensor) -> np.ndarray[Any, Any]:
    """A contiguous CPU copy of `tensor` as a numpy array (bf16 via ml_dtypes)."""
    import torch

    copy = torch.empty_like(tensor, device="cpu", memory_format=torch.contiguous_format)
    copy.copy_(tensor.detach())
    if copy.dtype == torch.bfloat16:
        import ml_dtypes

        return copy.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    try:
        return copy.numpy()
    except TypeError as exc:
        raise WeightsError(f"cannot send tensors of dtype {tensor.dtype}") from exc


def _alias_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    storage = tensor.untyped_storage().data_ptr()
    return (storage, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)


def snapshot_arrays(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
) -> tuple[list[tuple[str, np.ndarray[Any, Any]]], dict[str, str]]:
    """Copy tensors to CPU arrays, skipping tied duplicates; returns (arrays, aliases)."""
    arrays: list[tuple[str, np.ndarray[Any, Any]]] = []
    seen: dict[tuple[Any, ...], str] = {}
    aliases: dict[str, str] = {}
    for name, tensor in named_tensors:
        key = _alias_key(tensor)
        if key[0] != 0 and key in seen:  # data_ptr 0: empty/meta tensors alias nothing
            aliases[name] = seen[key]
            continue
        seen[key] = name
        arrays.append((name, _to_numpy(tensor)))
    return arrays, aliases


def _chunk_bounds(sizes: list[int], chunk_bytes: int) -> list[tuple[int, int]]:
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


def build_snapshot(
    version: int,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    settings: TransportSettings,
) -> Snapshot:
    """Copy, de-alias, chunk and size-check one version (raises WeightsError if too large)."""
    arrays, aliases = snapshot_arrays(named_tensors)
    for name, arr in arrays:
        if arr.nbytes > settings.max_frame_bytes:
            raise WeightsError(
                f"tensor {name} has {arr.nbytes} bytes, over transport.max_frame_bytes="
                f"{settings.max_frame_bytes}; raise it on every service"
            )
    bounds = _chunk_bounds([a.nbytes for _, a in arrays], settings.weights_chunk_bytes)
    chunks = []
    for index, (lo, hi) in enumerate(bounds):
        part = arrays[lo:hi]
        chunk = WeightsChunk(
            version=version, index=index, count=len(bounds),
            names=[n for n, _ in part], tensors=[a for _, a in part],
        )  # fmt: skip
        size = sum(memoryview(f).nbytes for f in encode(chunk))
        if size > settings.max_message_bytes:
            raise WeightsError(
                f"weights chunk {index} of version {version} has {size} bytes, over "
                f"transport.max_message_bytes={settings.max_message_bytes}"
            )
        chunks.append(chunk)
    total = sum(a.nbytes for _, a in arrays)
    return Snapshot(version, tuple(chunks), len(arrays), total, aliases)


class WeightServer:
    """Serves the newest weights snapshot on a ROUTER and announces versions on a PUB."""

    def __init__(
        self,
        ctx: Context,
        bind_router: str,
        bind_pub: str,
        settings: TransportSettings,
        security: SecuritySettings,
    ) -> None:
        self._ctx = ctx
        self._settings = settings
        self._security = security
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._current: Snapshot | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._router_address = ""
        self._failure: BaseException | None = None
        self.served = 0  # complete snapshots streamed (read for stats)
        self._announcer = Announcer(ctx, bind_pub, settings, security, "weights-announce")
        self._thread = threading.Thread(  # keeps the caller's bound log fields
            target=contextvars.copy_context().run,
            args=(self._run, bind_router),
            name="weight-server",
            daemon=True,
        )
        self._thread.start()
        if not self._ready.wait(timeout=30.0):
            self._stop.set()
            self._failure = TimeoutError("the serving thread did not bind within 30 s")
        if self._failure is not None:
            self._announcer.close()
            raise TransportError(f"weight server failed to start: {self._failure}")

    @property
    def addresses(self) -> dict[str, str]:
        """{"weights": ROUTER endpoint, "announce": PUB endpoint} (ports resolved)."""
        return {"weights": self._router_address, "announce": self._announcer.address}

    @property
    def version(self) -> int | None:
        """The version being served now (None before the first publish)."""
        with self._lock:
            return None if self._current is None else self._current.version

    def publish(self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Snapshot:
        """Snapshot the tensors, serve the snapshot, then announce it."""
        if not self._thread.is_alive():
            raise WeightsError(f"weight server thread stopped: {self._failure}")
        t0 = time.perf_counter()
        snapshot = build_snapshot(version, named_tensors, self._settings)
        with self._publish_lock:
            with self._lock:
                self._current = snapshot
            self._announcer.publish(
                WeightsAnnounce(
                    version=version,
                    num_tensors=snapshot.num_tensors,
                    total_bytes=snapshot.total_bytes,
                )
            )
        log.info(
            "weights.published", version=version, tensors=snapshot.num_tensors,
            mb=round(snapshot.total_bytes / 2**20, 3), chunks=len(snapshot.chunks),
            tied_skipped=sorted(snapshot.aliases), ms=round((time.perf_counter() - t0) * 1e3, 1),
        )  # fmt: skip
        return snapshot

    def close(self) -> None:
        """Stop serving (waits for the thread) and close the PUB socket."""
        self._stop.set()
        self._thread.join(timeout=10.0)
        self._announcer.close()

    def _run(self, bind_router: str) -> None:
        try:
            server = Server(self._ctx, bind_router, self._settings, self._security, "weights")
        except Exception as exc:  # reported to __init__, which raises it in the caller
            self._failure = exc
            self._ready.set()
            return
        self._router_address = server.address
        self._ready.set()
        try:
            self._serve(server)
        except Exception as exc:
            self._failure = exc
            log.exception("weights.server_failed")
        finally:
            server.close()

    def _serve(self, server: Server) -> None:
        streams: dict[bytes, _Stream] = {}
        while not self._stop.is_set():
            got = server.recv(BUSY_POLL_MS if streams else IDLE_POLL_MS)
            if got is not None:
                self._handle(server, streams, *got)
            self._pump(server, streams)

    def _handle(
        self, server: Server, streams: dict[bytes, _Stream], peer: bytes, msg: Message
    ) -> None:
        if not isinstance(msg, WeightsRequest):
            server.send(peer, Error(code="unexpected", message=f"{type(msg).__name__} here"))
            return
        with self._lock:
            current = self._current
        if current is None:
            server.send(peer, Error(code="no_weights", message="no weights published yet"))
            return
        if msg.version not in (-1, current.version):
            log.info("weights.request_redirected", asked=msg.version, serving=current.version)
        streams[peer] = _Stream(current)  # a repeated request restarts that peer's stream

    def _pump(self, server: Server, streams: dict[bytes, _Stream]) -> None:
        """Queue as many pending chunks as each peer's HWM allows."""
        for peer in list(streams):
            stream = streams[peer]
            chunks = stream.snapshot.chunks
            while stream.next_index < len(chunks):
                status = server.try_send(peer, chunks[stream.next_index])
                if status is SendStatus.FULL:
                    break
                if status is SendStatus.UNREACHABLE:
                    log.info("weights.peer_gone", version=stream.snapshot.version)
                    del streams[peer]
                    break
                stream.next_index += 1
            else:
                del streams[peer]
                self.served += 1
