"""The trainer's weight server (ZeroMQ, no NCCL); generators fetch from it with
`grpo_stream.transport.fetch`.

Invariants:
- A version is never half-served. `WeightServer.publish` copies every tensor to contiguous CPU
  memory, checksums and chunks the copy, computes the step delta from the previous version,
  swaps the finished snapshot in under a lock and only THEN announces WeightsAnnounce on PUB.
  A fetch in progress keeps streaming the chunks it started on, even if a newer version is
  published meanwhile, so a fetched set is always all of one version.
- Only the newest snapshot is held in full, plus the step deltas of the last
  `weights.delta_window` versions (`grpo_stream.transport.versions`). A WeightsRequest is
  answered with the current version: as deltas from `have` when the server holds a chain
  from it and deltas are on, else in full; with nothing published yet the answer is
  Error(code="no_weights").
- With `weights.relay`, each (version, base) stream is sent directly to at most
  `weights.fanout` fetchers; later fetchers get WeightsRedirect to a relay (a fetcher that
  said where it relays) with fewer than `fanout` children, breadth first, so the trainer
  sends each version O(fanout) times. `direct` requests (a fetcher whose relay failed) are
  always served here.
- A tensor that shares storage (same data, offset, shape, strides, dtype) with an earlier one
  (tied embeddings) is sent once, under the earlier name; the receiver's model re-ties it.
- Chunks go out without copies and without blocking: a peer whose queue is at the HWM is
  resumed later from where it stopped. Memory: the current snapshot and the step deltas,
  plus older chunk sets only while some peer is still being streamed one.
- Weights only to members: with the run's secret, a request without a valid, fresh, unseen
  proof of it (`transport.fetch_auth`), and under CURVE with per-role keys, one from a key
  that is neither a generator's nor the evaluator's, gets Error(code "unauthorized") and not
  one chunk (`weights.refused_fetch`, an error event, rate-limited). The proof covers the `relay`
  address, so only a member becomes a relay. Every WeightsRedirect names the version's
  checksum, which the fetcher checks the relay's chunks against.
- The ROUTER lives in a background thread that creates it; the PUB socket is used only by
  `publish` (serialised by a lock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import structlog

from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.protocols.messages import (
    Error,
    Message,
    WeightsAnnounce,
    WeightsChunk,
    WeightsRedirect,
    WeightsRequest,
)
from grpo_stream.ratelimit import RateLimit
from grpo_stream.transport.delta import RAW, version_checksum
from grpo_stream.transport.errors import TransportError, WeightsError
from grpo_stream.transport.fetch_auth import FetchGuard
from grpo_stream.transport.server_thread import ServerThread
from grpo_stream.transport.sockets import (
    Announcer,
    Context,
    SendStatus,
    Server,
)
from grpo_stream.transport.versions import DeltaHistory, Payload, Snapshot, make_chunks
from grpo_stream.transport.weights_snapshot import SnapshotBuffers, copy_snapshot

if TYPE_CHECKING:
    import torch

log = structlog.get_logger()

IDLE_POLL_MS = 100
"""Receive timeout of the serving loop when no stream is pending (also its stop latency)."""
BUSY_POLL_MS = 5
"""Receive timeout while some peer's stream waits for room under its HWM."""


@dataclass
class _Stream:
    """Where one peer's transfer stands; it keeps its chunks alive until done."""

    chunks: tuple[WeightsChunk, ...]
    version: int
    next_index: int = 0


def snapshot_arrays(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
) -> tuple[list[tuple[str, np.ndarray[Any, Any]]], dict[str, str]]:
    """Copy tensors to CPU arrays, skipping tied duplicates; returns (arrays, aliases)."""
    arrays, aliases, _ = copy_snapshot(named_tensors, with_checksums=False)
    return arrays, aliases


def build_snapshot(
    version: int,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    settings: TransportSettings,
    buffers: SnapshotBuffers | None = None,
) -> Snapshot:
    """Copy (into a buffer of `buffers` when given), de-alias, checksum, chunk and size-check
    one version (WeightsError: too large)."""
    arrays, aliases, checksums = copy_snapshot(named_tensors, buffers)
    for name, arr in arrays:
        if arr.nbytes > settings.max_frame_bytes:
            raise WeightsError(
                f"tensor {name} has {arr.nbytes} bytes, over transport.max_frame_bytes="
                f"{settings.max_frame_bytes}; raise it on every service"
            )
    total = version_checksum(list(checksums))
    payloads = [Payload(name, arr, RAW) for name, arr in arrays]
    chunks = make_chunks(version, -1, payloads, checksums, total, settings)
    nbytes = sum(a.nbytes for _, a in arrays)
    return Snapshot(version, chunks, len(arrays), nbytes, aliases, arrays, checksums, total)


class _Tree:
    """Who streams version v with base b to whom: the server and relays, `fanout` each."""

    def __init__(self, fanout: int) -> None:
        self.fanout = fanout
        self.direct = 0
        self.relays: list[tuple[str, int]] = []  # (address, children), in join order

    def place(self, relay: str | None) -> str | None:
        """The relay address a new fetcher should use (None: this server serves it)."""
        parent: str | None = None
        if self.direct < self.fanout:
            self.direct += 1
        else:
            for i, (address, children) in enumerate(self.relays):
                if children < self.fanout and address != relay:
                    self.relays[i] = (address, children + 1)
                    parent = address
                    break
            else:
                self.direct += 1  # no relay has room: the server serves it
        if relay is not None and all(a != relay for a, _ in self.relays):
            self.relays.append((relay, 0))
        return parent


class WeightServer:
    """Serves the newest weights version (full or as deltas) on a ROUTER, announces on a PUB."""

    def __init__(
        self,
        ctx: Context,
        bind_router: str,
        bind_pub: str,
        settings: TransportSettings,
        security: SecuritySettings,
        weights: WeightsSettings | None = None,
        secret: bytes | None = None,
    ) -> None:
        self._guard = FetchGuard(secret, security)  # who may fetch (the run's secret, CURVE roles)
        self._ctx = ctx
        self._settings = settings
        self._security = security
        self._weights = weights or WeightsSettings()
        self._history = DeltaHistory(
            self._weights.delta_window, self._weights.zstd_level, settings,
            max_ratio=self._weights.delta_max_ratio,
        )  # fmt: skip
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._current: Snapshot | None = None
        self._buffers = SnapshotBuffers()  # reused host memory of the snapshots
        self._trees: dict[tuple[int, int], _Tree] = {}
        self._warn = RateLimit()  # what any peer can make repeat is logged rate-limited
        self.served = 0  # complete version streams sent (read for stats)
        self.sent_bytes = 0  # tensor bytes of the streams started (read for stats)
        self.redirects = 0  # fetchers sent to a relay (read for stats)
        self._announcer = Announcer(
            ctx, bind_pub, settings, security, "weights-announce",
            guarded=secret is not None, setting="trainer.announce_bind",
        )  # fmt: skip
        try:
            self._serving = ServerThread(
                ctx, bind_router, settings, security, "weights", self._serve,
                guarded=secret is not None, setting="trainer.bind",
            )  # fmt: skip
        except TransportError:
            self._announcer.close()
            raise

    @property
    def addresses(self) -> dict[str, str]:
        """{"weights": ROUTER endpoint, "announce": PUB endpoint} (ports resolved)."""
        return {"weights": self._serving.address, "announce": self._announcer.address}

    @property
    def version(self) -> int | None:
        """The version being served now (None before the first publish)."""
        with self._lock:
            return None if self._current is None else self._current.version

    def delta_bytes(self, have: int) -> int | None:
        """Tensor bytes of the delta from `have` to the current version (None: no delta)."""
        with self._lock:
            current = self._current
            if current is None or not self._weights.deltas:
                return None
            chunks = self._history.chunks_from(have, current)
        return None if chunks is None else sum(int(t.nbytes) for c in chunks for t in c.tensors)

    def publish(self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Snapshot:
        """Snapshot the tensors, serve the version, then announce it; the step delta is
        computed on the server's thread (when idle, or when a fetcher first needs it)."""
        if not self._serving.alive():
            raise WeightsError(f"weight server thread stopped: {self._serving.failure}")
        t0 = time.perf_counter()
        snapshot = build_snapshot(version, named_tensors, self._settings, self._buffers)
        t_snap = time.perf_counter()
        with self._publish_lock:
            with self._lock:
                prev = self._current
            if self._weights.deltas:  # computed off this thread (the server's, when idle)
                self._history.defer(prev, snapshot)
            with self._lock:
                self._current = snapshot
                self._trees.clear()
            self._announcer.publish(
                WeightsAnnounce(
                    version=version,
                    num_tensors=snapshot.num_tensors,
                    total_bytes=snapshot.total_bytes,
                    checksum=snapshot.checksum,
                )
            )
        log.info(
            "weights.published", version=version, tensors=snapshot.num_tensors,
            mb=round(snapshot.total_bytes / 2**20, 3), chunks=len(snapshot.chunks),
            tied_skipped=sorted(snapshot.aliases), snapshot_ms=round((t_snap - t0) * 1e3, 1),
            ms=round((time.perf_counter() - t0) * 1e3, 1),
        )  # fmt: skip
        return snapshot

    def close(self) -> None:
        """Stop serving (waits for the thread) and close the PUB socket."""
        self._serving.close()
        self._announcer.close()

    def _serve(self, server: Server, stop: threading.Event) -> None:
        streams: dict[bytes, _Stream] = {}
        while not stop.is_set():
            got = server.recv(BUSY_POLL_MS if streams else IDLE_POLL_MS)
            if got is not None:
                self._handle(server, streams, *got)
            elif self._weights.deltas:
                self._history.settle()  # the new version's step delta, off the trainer's path
            self._pump(server, streams)

    def _handle(
        self, server: Server, streams: dict[bytes, _Stream], peer: bytes, msg: Message
    ) -> None:
        if not isinstance(msg, WeightsRequest):
            server.send(peer, Error(code="unexpected", message=f"{type(msg).__name__} here"))
            return
        if not self._guard.admit(server, peer, msg):
            return
        with self._lock:
            current = self._current
            if current is None:
                server.send(peer, Error(code="no_weights", message="no weights published yet"))
                return
            chunks = None
            if self._weights.deltas and msg.have >= 0:
                chunks = self._history.chunks_from(msg.have, current)
        base = msg.have if chunks is not None else -1
        if msg.version not in (-1, current.version):  # any peer can ask: rate-limited
            count = self._warn.allow("weights.request_redirected")
            if count is not None:
                log.info(
                    "weights.request_redirected", asked=msg.version, serving=current.version,
                    count=count,
                )  # fmt: skip
        if self._weights.relay and not msg.direct:
            tree = self._trees.setdefault((current.version, base), _Tree(self._weights.fanout))
            parent = tree.place(msg.relay)  # a member's: its request is signed or its key allowed
            if parent is not None:
                self.redirects += 1
                if (count := self._warn.allow("weights.sent_to_relay")) is not None:
                    log.info(
                        "weights.sent_to_relay", version=current.version, base=base,
                        relay=parent, count=count,
                    )  # fmt: skip
                redirect = WeightsRedirect(
                    version=current.version, base=base, address=parent, checksum=current.checksum
                )
                server.send(peer, redirect)
                return
        stream = _Stream(chunks if chunks is not None else current.chunks, current.version)
        self.sent_bytes += sum(int(t.nbytes) for c in stream.chunks for t in c.tensors)
        streams[peer] = stream  # a repeated request restarts that peer's stream

    def _pump(self, server: Server, streams: dict[bytes, _Stream]) -> None:
        """Queue as many pending chunks as each peer's HWM allows."""
        for peer in list(streams):
            stream = streams[peer]
            chunks = stream.chunks
            while stream.next_index < len(chunks):
                status = server.try_send(peer, chunks[stream.next_index])
                if status is SendStatus.FULL:
                    break
                if status is SendStatus.UNREACHABLE:
                    if (count := self._warn.allow("weights.peer_gone")) is not None:
                        log.info("weights.peer_gone", version=stream.version, count=count)
                    del streams[peer]
                    break
                stream.next_index += 1
            else:
                del streams[peer]
                self.served += 1
