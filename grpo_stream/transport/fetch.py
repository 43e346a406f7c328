"""The generators' side of weight transfer: fetch one whole version from the trainer's
weight server (`grpo_stream.transport.weights`) or a relay it redirects to, and follow the
trainer's announcements.

Invariants:
- A fetch returns all tensors of exactly one version, in the server's order, or raises
  (WeightsTimeout naming the address, WeightsError for a refusal or chunks that do not form
  one version). Each fetch uses a fresh identity, so no stale reply reaches it.
- A `Replica` holds the wire arrays of the version its owner applied last: the base the
  server's deltas are against. Chunks are applied as they arrive (streaming apply) into a
  staging dict; every tensor is checked against its checksum, the whole against the
  version's checksum, and only then does the staging dict replace the replica's (one swap).
  Once a version is held, the next is staged in a reused, pre-faulted buffer laid out like it
  (`grpo_stream.transport.fetch_buffers`; each frame is copied out and dropped on arrival);
  the first is kept as views over the received frames. Peak extra memory: one staging copy.
- A delta against a base the replica does not hold, a corrupt or truncated zstd frame or a
  checksum mismatch is refused (`weights.refused`, one error event) and the version is
  fetched again in full from the trainer's server, never applied half.
- A relay that stalls for `weights.relay_stall_s` or fails is given up: the version is
  fetched again directly from the trainer's server (`direct`). A relay's chunks must carry
  and add up to the checksum the trainer's server named in its WeightsRedirect: a relay
  serving anything else is refused like a bad delta (`weights.refused`) and the version
  fetched in full from the trainer.
- A server that sends nothing for `weights.fetch_stall_s` (say it died mid-fetch) fails the
  fetch with WeightsTimeout then, not at the whole fetch's deadline; the caller retries.
- A fetch that takes longer than a few seconds reports its progress (`weights.fetch.progress`).
- With the run's secret every request is signed (`transport.fetch_auth.sign_fetch`: a fresh
  nonce each, to the trainer's server and to a relay alike); servers refuse unsigned ones.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import structlog
import zmq

from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.progress import Wait, long_wait
from grpo_stream.protocols.messages import (
    Error,
    WeightsAnnounce,
    WeightsChunk,
    WeightsRedirect,
    WeightsRequest,
)
from grpo_stream.transport.delta import (
    RAW,
    XOR_ZSTD,
    DeltaError,
    apply_delta,
    checksum,
    version_checksum,
)
from grpo_stream.transport.errors import SendTimeout, WeightsError, WeightsTimeout
from grpo_stream.transport.fetch_auth import sign_fetch
from grpo_stream.transport.fetch_buffers import StagingBuffers, place, target
from grpo_stream.transport.sockets import Client, Context, Subscriber

log = structlog.get_logger()

Arrays = list[tuple[str, np.ndarray[Any, Any]]]


class WeightsRefused(WeightsError):
    """Chunks that must not be applied: wrong base, corrupt delta, checksum mismatch."""


class RelaySink(Protocol):
    """Where a fetcher hands what it receives to serve it on (`transport.relay.Relay`)."""

    address: str

    def expect(self, version: int, base: int) -> None: ...
    def offer(self, chunk: WeightsChunk) -> None: ...
    def abort(self) -> None: ...


@dataclass
class _Staging:
    """One version being reconstructed from its chunks as they arrive."""

    version: int
    count: int
    base: int
    checksum: int
    seen: set[int] = field(default_factory=set)
    parts: dict[int, Arrays] = field(default_factory=dict)
    checksums: dict[int, list[int]] = field(default_factory=dict)

    def add(self, chunk: WeightsChunk, replica: Replica, address: str) -> None:
        if (chunk.version, chunk.count, chunk.base, chunk.checksum) != (
            self.version, self.count, self.base, self.checksum,
        ):  # fmt: skip
            raise WeightsError(
                f"weights from {address}: chunk of version {chunk.version} (count "
                f"{chunk.count}, base {chunk.base}) inside version {self.version} (count "
                f"{self.count}, base {self.base})"
            )
        if not 0 <= chunk.index < self.count or chunk.index in self.seen:
            raise WeightsError(f"weights from {address}: bad or repeated chunk {chunk.index}")
        n = len(chunk.names)
        if len(chunk.tensors) != n or len(chunk.checksums) != n or len(chunk.encodings) != n:
            raise WeightsRefused(f"weights from {address}: chunk {chunk.index} is inconsistent")
        self.seen.add(chunk.index)
        self.parts[chunk.index] = [
            (name, _reconstruct(name, arr, enc, want, replica, self.base))
            for name, arr, enc, want in zip(
                chunk.names, chunk.tensors, chunk.encodings, chunk.checksums, strict=True
            )
        ]
        self.checksums[chunk.index] = list(chunk.checksums)

    def done(self) -> bool:
        return len(self.seen) == self.count

    def tensors(self) -> Arrays:
        sums = [c for i in range(self.count) for c in self.checksums[i]]
        if version_checksum(sums) != self.checksum:
            raise WeightsRefused(f"version {self.version}: version checksum mismatch")
        return [item for i in range(self.count) for item in self.parts[i]]


def _reconstruct(
    name: str, arr: np.ndarray[Any, Any], encoding: str, want: int, replica: Replica, base: int
) -> np.ndarray[Any, Any]:
    if encoding == RAW:
        out = place(arr, replica.staging.slot(name, arr.nbytes))
    elif encoding == XOR_ZSTD:
        held = replica.arrays.get(name) if replica.version == base else None
        if held is None:
            raise WeightsRefused(f"{name}: a delta against version {base}, not held here")
        try:
            out = apply_delta(held, arr, target(held, replica.staging.slot(name, held.nbytes)))
        except DeltaError as exc:
            raise WeightsRefused(f"{name}: {exc}") from None
    else:
        raise WeightsRefused(f"{name}: unknown encoding {encoding!r}")
    if checksum(out) != want:
        raise WeightsRefused(f"{name}: checksum mismatch")
    return out


class Replica:
    """The wire arrays of the version held (the base for deltas), updated whole per version."""

    def __init__(self) -> None:
        self.version = -1
        self.checksum = 0
        self.arrays: dict[str, np.ndarray[Any, Any]] = {}
        self.order: list[str] = []
        self.last_wire_bytes = 0  # tensor bytes received by the last successful fetch
        self.staging = StagingBuffers()  # reused memory the next version is staged in

    def named(self) -> Arrays:
        """The held tensors in the server's order."""
        return [(name, self.arrays[name]) for name in self.order]

    def fetch(
        self,
        ctx: Context,
        address: str,
        settings: TransportSettings,
        security: SecuritySettings,
        version: int = -1,
        timeout_s: float = 60.0,
        weights: WeightsSettings | None = None,
        relay: RelaySink | None = None,
        secret: bytes | None = None,
    ) -> int:
        """Fetch `version` (-1: the newest) as a delta from the held one when the server can,
        apply it whole, and return the version now held. A refused delta is logged once and
        fetched again in full from `address`; a failed relay is replaced by `address`.
        `secret`: the run's, which signs every request."""
        got = weights or WeightsSettings()
        link = _Link(ctx, settings, security, timeout_s, got, relay, secret)
        self.staging.begin()
        try:
            return self._swap(*link.receive(address, version, self))
        except WeightsRefused as exc:
            log.error("weights.refused", address=address, held=self.version, reason=str(exc))
            link.relay = None
            self.staging.begin()  # the refused attempt's arrays are gone: its buffer is free
            return self._swap(*link.receive(address, version, self, direct=True, full=True))
        finally:
            self.staging.end()

    def _swap(self, version: int, total: int, named: Arrays, wire: int) -> int:
        self.arrays = dict(named)
        self.order = [name for name, _ in named]
        self.staging.learn(named)
        self.version, self.checksum, self.last_wire_bytes = version, total, wire
        return version


@dataclass
class _Link:
    """One fetch's sockets and settings; follows at most one redirect to a relay."""

    ctx: Context
    settings: TransportSettings
    security: SecuritySettings
    timeout_s: float
    weights: WeightsSettings
    relay: RelaySink | None
    secret: bytes | None = None

    def signed(self, request: WeightsRequest) -> WeightsRequest:
        """`request` with a fresh proof of the run's secret (as is without one)."""
        return request if self.secret is None else sign_fetch(self.secret, request)

    def receive(
        self, origin: str, version: int, replica: Replica, direct: bool = False, full: bool = False
    ) -> tuple[int, int, Arrays, int]:
        """(version, version checksum, tensors, wire bytes) from `origin` or its relay
        (`full`: ask for the whole set, not a delta)."""
        have = -1 if full else replica.version
        relay_at = None if self.relay is None else self.relay.address
        request = WeightsRequest(version=version, have=have, relay=relay_at, direct=direct)
        try:
            got = self._once(origin, request, replica, stall_s=self.weights.fetch_stall_s)
            if isinstance(got, WeightsRedirect):
                got = self._via_relay(got, origin, request, replica)
            if isinstance(got, WeightsRedirect):
                raise WeightsError(f"weights from {origin}: redirected twice")
            return got
        except BaseException:
            if self.relay is not None:
                self.relay.abort()
            raise

    def _via_relay(
        self, redirect: WeightsRedirect, origin: str, request: WeightsRequest, replica: Replica
    ) -> tuple[int, int, Arrays, int] | WeightsRedirect:
        """The redirected version from the relay; from `origin` directly if the relay fails."""
        via = WeightsRequest(version=redirect.version, have=redirect.base, relay=request.relay)
        try:
            got = self._once(
                redirect.address, via, replica, self.weights.relay_stall_s, redirect.checksum
            )
        except WeightsRefused:
            raise
        except (WeightsTimeout, WeightsError) as exc:
            log.warning("weights.relay_failed", relay=redirect.address, reason=str(exc))
            if self.relay is not None:
                self.relay.abort()  # our own children go to the trainer too
            request.direct = True
            return self._once(origin, request, replica, stall_s=self.weights.fetch_stall_s)
        if isinstance(got, WeightsRedirect) or got[0] != redirect.version:
            raise WeightsRefused(f"relay {redirect.address} served another version")
        return got

    def _once(
        self,
        address: str,
        request: WeightsRequest,
        replica: Replica,
        stall_s: float,
        announced: int | None = None,
    ) -> tuple[int, int, Arrays, int] | WeightsRedirect:
        """One request to `address`; `announced`: the checksum its chunks must carry (a
        relay's, as the trainer's server named it)."""
        identity = f"weights-fetch-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # fresh: no stale replies
        client = Client(self.ctx, address, self.settings, self.security, identity)
        try:
            with long_wait("weights.fetch", unit="chunks", address=address) as wait:
                self._send(client, self.signed(request), address)
                return self._chunks(client, address, replica, stall_s, wait, announced)
        finally:
            client.close()

    def _send(self, client: Client, request: WeightsRequest, address: str) -> None:
        """The request queued, or WeightsTimeout: a server that refused this client's key
        (CURVE) leaves it no connection to queue on, and whether the refusal came before the
        send is a matter of timing; the caller sees the one error the fetch promises."""
        try:
            client.send(request)
        except SendTimeout:
            raise WeightsTimeout(
                f"weights from {address}: the request could not be sent within "
                f"transport.io_timeout_ms={self.settings.io_timeout_ms} (the server is not "
                "reachable, or it refuses this client's key)"
            ) from None

    def _chunks(
        self,
        client: Client,
        address: str,
        replica: Replica,
        stall_s: float,
        wait: Wait,
        announced: int | None = None,
    ) -> tuple[int, int, Arrays, int] | WeightsRedirect:
        deadline = time.monotonic() + self.timeout_s
        staging: _Staging | None = None
        received, last = 0, time.monotonic()
        while staging is None or not staging.done():
            until = min(deadline, last + stall_s)
            left_ms = int((until - time.monotonic()) * 1000)
            msg = client.recv(max(1, left_ms)) if left_ms > 0 else None
            if msg is None and time.monotonic() >= until:
                got = 0 if staging is None else len(staging.seen)
                want = "?" if staging is None else staging.count
                raise WeightsTimeout(
                    f"weights from {address}: {got}/{want} chunks within {self.timeout_s:g} s "
                    f"(or nothing for {stall_s:g} s)"
                )
            last = time.monotonic() if msg is not None else last
            if isinstance(msg, Error):
                raise WeightsError(f"weights from {address}: {msg.message} ({msg.code})")
            if isinstance(msg, WeightsRedirect) and staging is None:
                return msg
            if isinstance(msg, WeightsChunk):
                if announced is not None and msg.checksum != announced:
                    raise WeightsRefused(
                        f"weights from {address}: version {msg.version} with checksum "
                        f"{msg.checksum}, the trainer announced {announced}"
                    )
                if staging is None:
                    staging = _Staging(msg.version, msg.count, msg.base, msg.checksum)
                    if self.relay is not None:
                        self.relay.expect(msg.version, msg.base)
                staging.add(msg, replica, address)
                if self.relay is not None:
                    self.relay.offer(msg)
                received += sum(int(t.nbytes) for t in msg.tensors)
                wait.done, wait.total = len(staging.seen), staging.count
                wait.fields.update(version=staging.version, mib=round(received / 2**20, 1))
        return staging.version, staging.checksum, staging.tensors(), received


def fetch_weights(
    ctx: Context,
    address: str,
    settings: TransportSettings,
    security: SecuritySettings,
    version: int = -1,
    timeout_s: float = 60.0,
    secret: bytes | None = None,
) -> tuple[int, Arrays]:
    """Request one version (-1: the newest) in full and return (version, [(name, array)]);
    `secret`: the run's, which signs the request.

    Raises WeightsTimeout (naming the address) when not all chunks arrive in time, WeightsError
    when the server refuses or the chunks do not form exactly one version.
    """
    replica = Replica()
    got = replica.fetch(ctx, address, settings, security, version, timeout_s, secret=secret)
    return got, replica.named()


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
