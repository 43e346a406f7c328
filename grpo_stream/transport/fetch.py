"""The generators' side of weight transfer: fetch one whole version from the trainer's
weight server (`grpo_stream.transport.weights`), and follow its announcements.

Invariants: a fetch returns all tensors of exactly one version, in the server's order, or
raises (WeightsTimeout naming the address, WeightsError for a refusal or chunks that do not
form one version); each fetch uses a fresh identity, so no stale reply from an earlier fetch
reaches it. A fetch that takes longer than a few seconds reports its progress
(`weights.fetch.progress`: chunks and MiB so far).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from grpo_stream.progress import Wait, long_wait
from grpo_stream.protocols.messages import Error, WeightsAnnounce, WeightsChunk, WeightsRequest
from grpo_stream.transport.errors import WeightsError, WeightsTimeout
from grpo_stream.transport.settings import SecuritySettings, TransportSettings
from grpo_stream.transport.sockets import Client, Context, Subscriber


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
