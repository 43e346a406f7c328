"""A generator's relay: it serves the weights stream it is receiving to other fetchers, chunk
by chunk as the chunks arrive (pipelined), on its own ROUTER.

The trainer's server places fetchers in a tree (`weights.fanout` children per node, see
`grpo_stream.transport.weights`) and redirects later fetchers here with WeightsRedirect.

Invariants:
- A relay serves exactly the stream (version, base) its owner is receiving or last received
  whole, the chunk messages unchanged (same checksums), so a child checks them exactly as it
  would the trainer's. A request for anything else gets Error(code="not_relaying").
- When its owner's fetch fails (`abort`), every child being served gets
  Error(code="relay_failed") and fetches directly from the trainer; a relay that dies simply
  stops sending, and its children give up after `weights.relay_stall_s`.
- CURVE: the ROUTER is secured like every binding socket (`security`), and a relay bound
  beyond loopback needs CURVE or the run's secret. Like the trainer's server it serves
  members only (`transport.fetch_auth.FetchGuard`): a request without proof of the run's
  secret (or, under per-role keys, not from a generator's or the evaluator's key) gets Error(code
  "unauthorized") and no chunk (`weights.refused_fetch`, an error event).
- The ROUTER lives in its own thread (`transport.server_thread`); `expect`/`offer`/`abort`
  are called from the owner's thread and only touch state under a lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import structlog

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.protocols.messages import Error, WeightsChunk, WeightsRequest
from grpo_stream.transport.fetch_auth import FetchGuard
from grpo_stream.transport.server_thread import ServerThread
from grpo_stream.transport.sockets import Context, SendStatus, Server

log = structlog.get_logger()

IDLE_POLL_MS = 100
BUSY_POLL_MS = 2


@dataclass
class _Feed:
    """The stream being relayed: chunks in arrival order (index order is not assumed)."""

    version: int
    base: int
    chunks: list[WeightsChunk] = field(default_factory=list)
    failed: bool = False


@dataclass
class _Child:
    feed: _Feed
    sent: int = 0


class Relay:
    """Serves its owner's incoming weights stream to children (see module docstring)."""

    def __init__(
        self,
        ctx: Context,
        bind: str,
        settings: TransportSettings,
        security: SecuritySettings,
        wait_s: float = 5.0,
        secret: bytes | None = None,
    ) -> None:
        self._wait_s = wait_s
        self._guard = FetchGuard(secret, security)
        self._lock = threading.Lock()
        self._feed: _Feed | None = None
        self.served = 0  # complete streams relayed (read for stats)
        self._serving = ServerThread(
            ctx,
            bind,
            settings,
            security,
            "weights-relay",
            self._serve,
            guarded=secret is not None,
            setting="weights.relay_bind",
        )
        self.address = self._serving.address

    def expect(self, version: int, base: int) -> None:
        """The owner starts receiving (version, base): children may ask for it now."""
        with self._lock:
            self._feed = _Feed(version, base)

    def offer(self, chunk: WeightsChunk) -> None:
        """One more chunk of the stream announced by `expect`."""
        with self._lock:
            if self._feed is not None and chunk.version == self._feed.version:
                self._feed.chunks.append(chunk)

    def abort(self) -> None:
        """The owner's fetch failed: children are told to go to the trainer."""
        with self._lock:
            if self._feed is not None:
                self._feed.failed = True
            self._feed = None

    def close(self) -> None:
        self._serving.close()

    def _serve(self, server: Server, stop: threading.Event) -> None:
        children: dict[bytes, _Child] = {}
        pending: dict[bytes, tuple[WeightsRequest, float]] = {}
        while not stop.is_set():
            got = server.recv(BUSY_POLL_MS if children or pending else IDLE_POLL_MS)
            if got is not None:
                peer, msg = got
                pending.pop(peer, None)
                if isinstance(msg, WeightsRequest):
                    if self._guard.admit(server, peer, msg):
                        pending[peer] = (msg, time.monotonic() + self._wait_s)
                else:
                    server.send(peer, Error(code="unexpected", message=f"{msg.KIND} here"))
            self._admit(server, children, pending)
            self._pump(server, children)

    def _admit(
        self,
        server: Server,
        children: dict[bytes, _Child],
        pending: dict[bytes, tuple[WeightsRequest, float]],
    ) -> None:
        """Start children whose stream is here; a child may ask before its first chunk came
        (it is redirected as soon as this relay asked): it waits up to `wait_s`."""
        with self._lock:
            feed = self._feed
        now = time.monotonic()
        for peer, (msg, until) in list(pending.items()):
            if feed is not None and (feed.version, feed.base) == (msg.version, msg.have):
                children[peer] = _Child(feed)
                del pending[peer]
            elif now >= until or (feed is not None and feed.version > msg.version):
                held = None if feed is None else (feed.version, feed.base)
                server.send(peer, Error(code="not_relaying", message=f"relaying {held}"))
                del pending[peer]

    def _pump(self, server: Server, children: dict[bytes, _Child]) -> None:
        for peer in list(children):
            child = children[peer]
            with self._lock:
                ready = list(child.feed.chunks[child.sent :])
                failed = child.feed.failed
            if failed:
                server.send(peer, Error(code="relay_failed", message="the relay's fetch failed"))
                del children[peer]
                continue
            for chunk in ready:
                status = server.try_send(peer, chunk)
                if status is SendStatus.FULL:
                    break
                if status is SendStatus.UNREACHABLE:
                    del children[peer]
                    break
                child.sent += 1
            if peer in children and ready and child.sent == ready[0].count:
                del children[peer]
                self.served += 1
