"""The trainer's weight server and the generators' fetcher (ZeroMQ, no NCCL).

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
import os
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import structlog
import zmq

from grpo_stream.progress import Wait, long_wait
from grpo_stream.protocols.codec import encode
from grpo_stream.protocols.messages import (
    Error,
    Message,
    WeightsAnnounce,
    WeightsChunk,
    WeightsRequest,
)
from grpo_stream.transport.errors import TransportError, WeightsError, WeightsTimeout
from grpo_stream.transport.settings import SecuritySettings, TransportSettings
from grpo_stream.transport.sockets import (
    Announcer,
    Client,
    Context,
    SendStatus,
    Server,
    Subscriber,
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


@dataclass
class _Assembly:
    """Chunks of one version as they arrive."""

    version: int
    count: int
    parts: dict[int, WeightsChunk] = field(default_factory=dict)

    def add(self, chunk: WeightsChunk, address: str) -> None:
        if chunk.version != self.version or chunk.count != self.count:
            raise WeightsError(
                f"weights from {address}: chunk of version {chunk.version} (count {chunk.count}) "
                f"inside version {self.version} (count {self.count})"
            )
        if not 0 <= chunk.index < self.count or chunk.index in self.parts:
            raise WeightsError(f"weights from {address}: bad or repeated chunk {chunk.index}")
        self.parts[chunk.index] = chunk

    def tensors(self) -> list[tuple[str, np.ndarray[Any, Any]]]:
        out: list[tuple[str, np.ndarray[Any, Any]]] = []
        for index in range(self.count):
            chunk = self.parts[index]
            out.extend(zip(chunk.names, chunk.tensors, strict=True))
        return out


def fetch_weights(
    ctx: Context,
    address: str,
    settings: TransportSettings,
    security: SecuritySettings,
    version: int = -1,
    timeout_s: float = 60.0,
) -> tuple[int, list[tuple[str, np.ndarray[Any, Any]]]]:
    """Request one version (-1: the newest) and return (version, [(name, array)]) in order.

    Raises WeightsTimeout (naming the address) when not all chunks arrive in time, WeightsError
    when the server refuses or the chunks do not form exactly one version.
    """
    identity = f"weights-fetch-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # fresh: no stale replies
    client = Client(ctx, address, settings, security, identity)
    try:
        with long_wait("weights.fetch", unit="chunks", address=address) as wait:
            return _receive_version(client, address, version, timeout_s, wait)
    finally:
        client.close()


def _receive_version(
    client: Client, address: str, version: int, timeout_s: float, wait: Wait
) -> tuple[int, list[tuple[str, np.ndarray[Any, Any]]]]:
    client.send(WeightsRequest(version=version))
    deadline = time.monotonic() + timeout_s
    assembly: _Assembly | None = None
    received = 0
    while assembly is None or len(assembly.parts) < assembly.count:
        left_ms = int((deadline - time.monotonic()) * 1000)
        msg = client.recv(max(1, left_ms)) if left_ms > 0 else None
        if msg is None and time.monotonic() >= deadline:
            got = 0 if assembly is None else len(assembly.parts)
            want = "?" if assembly is None else assembly.count
            raise WeightsTimeout(
                f"weights from {address}: {got}/{want} chunks within {timeout_s:g} s"
            )
        if isinstance(msg, Error):
            raise WeightsError(f"weights from {address}: {msg.message} ({msg.code})")
        if isinstance(msg, WeightsChunk):
            assembly = assembly or _Assembly(msg.version, msg.count)
            assembly.add(msg, address)
            received += sum(int(t.nbytes) for t in msg.tensors)
            wait.done, wait.total = len(assembly.parts), assembly.count
            wait.fields.update(version=assembly.version, mib=round(received / 2**20, 1))
    return assembly.version, assembly.tensors()


class WeightsWatcher:
    """Follows the trainer's announcements (SUB on the announce address)."""

    def __init__(
        self,
        ctx: Context,
        address: str,
        settings: TransportSettings,
        security: SecuritySettings,
    ) -> None:
        self._sub = Subscriber(ctx, address, settings, security, "weights-watch")
        self.latest: WeightsAnnounce | None = None

    def poll(self, timeout_ms: int = 0) -> int | None:
        """Drain pending announcements; the most recently announced version (None: none yet).

        The last one received wins, not the largest: a trainer restarted from a checkpoint
        may announce a lower version, and that is the one being served.
        """
        wait_ms = timeout_ms
        while self._sub.socket.poll(wait_ms, zmq.POLLIN):
            msg = self._sub.recv(0)  # None for a malformed one: counted, and we read on
            if isinstance(msg, WeightsAnnounce):
                self.latest = msg
            wait_ms = 0
        return None if self.latest is None else self.latest.version

    def close(self) -> None:
        self._sub.close()
