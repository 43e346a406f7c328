"""One engine's weight fetches: the version it holds, and the relay it serves it from.

Both engines (hf in process, vLLM for all its workers) fetch through a `VersionFetcher`.

Invariants:
- one fetch at a time: the `Replica` (the wire arrays of the version held, base of the
  server's deltas, every tensor and the whole version checksummed) is never read while it
  is written;
- with the run's `secret` every request is signed: a weight server or relay of a run with
  one serves nothing to a fetcher without it (`grpo_stream.transport.fetch_auth`);
- with `weights.relay`, what arrives is served to other generators by a `Relay` started on
  the first fetch, which serves members only likewise.
- `fetches` counts versions fetched over the network (one per version however many workers
  load it).
"""

from __future__ import annotations

import threading
from typing import Any

import zmq

from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.transport.fetch import Arrays, Replica
from grpo_stream.transport.relay import Relay


class VersionFetcher:
    """Fetches versions for one engine: delta base and relay kept between fetches."""

    def __init__(
        self,
        transport: TransportSettings,
        security: SecuritySettings,
        weights: WeightsSettings,
        secret: bytes | None = None,
    ) -> None:
        self._transport = transport
        self._security = security
        self._weights = weights
        self._secret = secret
        self._ctx: zmq.Context[Any] | None = None
        self._replica = Replica()
        self._relay: Relay | None = None
        self._lock = threading.Lock()
        self.fetches = 0

    def fetch(self, address: str, version: int = -1) -> tuple[int, Arrays]:
        """`version` (-1: the newest) from `address`, as a delta from the one held when the
        server can; (version, tensors in the server's order)."""
        with self._lock:
            if self._ctx is None:
                self._ctx = zmq.Context()
            if self._weights.relay and self._relay is None:
                self._relay = Relay(
                    self._ctx, self._weights.relay_bind, self._transport, self._security,
                    wait_s=self._weights.relay_stall_s, secret=self._secret,
                )  # fmt: skip
            got = self._replica.fetch(
                self._ctx, address, self._transport, self._security, version=version,
                weights=self._weights, relay=self._relay, secret=self._secret,
            )  # fmt: skip
            self.fetches += 1
            return got, self._replica.named()

    def forget(self) -> None:
        """Drop the held version: the next fetch is a full one (after a refused update)."""
        with self._lock:
            self._replica = Replica()

    @property
    def relay(self) -> Relay | None:
        """The relay serving what this fetcher receives (None until the first fetch, or
        without `weights.relay`)."""
        return self._relay

    def close(self) -> None:
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None
