"""Direct payloads (`hub.payloads = "direct"`): a generator's bounded store of the Rollouts it
sampled, served on its own ROUTER, and the client that scorers and the trainer fetch with.

Invariants:
- the store holds at most `capacity` groups, oldest evicted first; it answers a request for
  an evicted group `payload_evicted`, for one it never held `payload_unknown_group`, for one
  held under another digest `payload_wrong_digest` (`protocols.payloads.PAYLOAD_ERRORS`);
- one thread owns the ROUTER and answers each request once, in order, so `PayloadFetcher`
  matches the replies of one connection by position;
- a fetched Rollout is returned only if its digest (recomputed from what arrived) and group
  id are the reference's; anything else is a code, never a payload;
- the ROUTER is a `transport.sockets.Server`: CURVE-secured with the run's server keys when
  `security.curve`, like every other server.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import structlog
import zmq

from grpo_stream.config import RunConfig
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.hub.dispatch import largest_lease
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.digest import payload_digest
from grpo_stream.protocols.payloads import PayloadRequest, RolloutMeta
from grpo_stream.transport.errors import TransportError
from grpo_stream.transport.server_thread import ServerThread
from grpo_stream.transport.sockets import Client, Context, Server

log = structlog.get_logger()

POLL_MS = 50  # the serving thread notices `close` within this
EVICTED_MEMORY = 8  # evicted ids remembered: this many times the capacity


class PayloadStore:
    """Rollouts by group id, bounded, safe to use from the generator and the serving thread."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"payload store capacity must be >= 1, not {capacity}")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._held: OrderedDict[int, tuple[str, m.Rollout]] = OrderedDict()
        self._evicted: OrderedDict[int, None] = OrderedDict()
        self.served = 0
        self.refused = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def put(self, rollout: m.Rollout) -> str:
        """Keep `rollout` (replacing an older one of its group); returns its digest."""
        digest = payload_digest(rollout)
        with self._lock:
            self._held.pop(rollout.group_id, None)
            self._evicted.pop(rollout.group_id, None)
            self._held[rollout.group_id] = (digest, rollout)
            while len(self._held) > self.capacity:
                gid, _ = self._held.popitem(last=False)
                self._evicted[gid] = None
            while len(self._evicted) > EVICTED_MEMORY * self.capacity:
                self._evicted.popitem(last=False)
        return digest

    def answer(self, request: PayloadRequest) -> m.Message:
        """The stored Rollout, or the Error that says why not."""
        with self._lock:
            held = self._held.get(request.group_id)
            evicted = request.group_id in self._evicted
        if held is not None and held[0] == request.digest:
            self.served += 1
            return held[1]
        self.refused += 1
        if held is not None:
            code, why = "payload_wrong_digest", f"held with digest {held[0]}"
        elif evicted:
            code, why = "payload_evicted", f"evicted (store of {self.capacity} groups)"
        else:
            code, why = "payload_unknown_group", "never held here"
        return m.Error(code=code, message=f"group {request.group_id}: {why}", in_reply_to="payload")


class PayloadServer:
    """Serves a `PayloadStore` on a ROUTER bound at `bind`, from its own thread."""

    def __init__(
        self,
        ctx: Context,
        bind: str,
        settings: TransportSettings,
        security: SecuritySettings,
        store: PayloadStore,
        guarded: bool = False,
    ) -> None:
        self.store = store
        # guarded: its generator holds the run's secret (it may bind beyond loopback)
        self._serving = ServerThread(
            ctx, bind, settings, security, "payloads", self._serve, guarded, "hub.payload_bind"
        )
        self.address = self._serving.address

    def close(self) -> None:
        self._serving.close()

    def _serve(self, server: Server, stop: threading.Event) -> None:
        while not stop.is_set():
            got = server.recv(POLL_MS)
            if got is None:
                continue
            peer, msg = got
            if isinstance(msg, PayloadRequest):
                server.send(peer, self.store.answer(msg))
            else:
                server.send(peer, m.Error(code="unexpected_kind", message=f"{msg.KIND} here"))


def store_capacity(cfg: RunConfig) -> int:
    """Groups a generator keeps: as many as the hub can hold un-trained at once (the
    staleness gate's pipeline and the replay buffer), plus what it is generating."""
    hub = cfg.hub
    return (
        hub.replay.capacity + hub.groups_per_step * (hub.max_staleness + 2) + 2 * largest_lease(cfg)
    )


class Sender(Protocol):
    def send(self, msg: m.Message) -> None: ...


class PayloadOutbox:
    """A generator's way out under hub.payloads = "direct": `send` keeps a Rollout in the
    store and sends its RolloutMeta to the hub (anything else goes to the hub as it is)."""

    def __init__(
        self,
        link: Sender,
        ctx: Context,
        cfg: RunConfig,
        security: SecuritySettings,
        guarded: bool = False,
    ) -> None:
        self.link = link
        self.store = PayloadStore(store_capacity(cfg))
        self.server = PayloadServer(
            ctx, cfg.hub.payload_bind, cfg.transport, security, self.store, guarded
        )
        self.source = _reachable(self.server.address)

    def send(self, msg: m.Message) -> None:
        if isinstance(msg, m.Rollout):
            msg = rollout_meta(msg, self.source, self.store.put(msg))
        self.link.send(msg)

    def close(self) -> None:
        self.server.close()


def _reachable(address: str) -> str:
    """A bound address others can connect to (a wildcard host becomes this host's name)."""
    for wildcard in ("tcp://0.0.0.0:", "tcp://*:"):
        if address.startswith(wildcard):
            return f"tcp://{socket.gethostname()}:{address.removeprefix(wildcard)}"
    return address


@dataclass(frozen=True)
class PayloadRef:
    """Where one group's payload is and what it must hash to."""

    group_id: int
    source: str
    digest: str


_FETCHERS = itertools.count()


class PayloadFetcher:
    """Fetches Rollouts by reference from generators' payload stores, one DEALER per store,
    every request of a fetch sent before the first reply is awaited."""

    def __init__(
        self,
        ctx: Context,
        settings: TransportSettings,
        security: SecuritySettings,
        role: str,
        timeout_s: float,
    ) -> None:
        self.ctx = ctx
        self.settings = settings
        self.security = security
        self.timeout_s = timeout_s
        self._name = f"{role}-payloads-{os.getpid()}-{next(_FETCHERS)}"
        self._clients: dict[str, Client] = {}

    def fetch(self, refs: list[PayloadRef]) -> dict[int, m.Rollout | str]:
        """Each ref's Rollout, or a code: one of `PAYLOAD_ERRORS`, "unreachable" (no answer
        within `timeout_s`), "mismatch" (another group or digest came back)."""
        asked: dict[str, list[PayloadRef]] = {}
        for ref in refs:
            asked.setdefault(ref.source, []).append(ref)
        out: dict[int, m.Rollout | str] = {}
        for source, wanted in list(asked.items()):
            client = self._client(source)
            try:
                for ref in wanted:
                    client.send(PayloadRequest(group_id=ref.group_id, digest=ref.digest))
            except TransportError:  # no room to queue: the store is not reading
                self._drop(source)
                out.update({ref.group_id: "unreachable" for ref in wanted})
                del asked[source]
        self._collect(asked, out)
        return out

    def _collect(self, asked: dict[str, list[PayloadRef]], out: dict[int, m.Rollout | str]) -> None:
        deadline = time.monotonic() + self.timeout_s
        poller = zmq.Poller()
        by_socket = {self._clients[s].socket: s for s in asked}
        for sock in by_socket:
            poller.register(sock, zmq.POLLIN)
        while asked and (left := deadline - time.monotonic()) > 0:
            for sock, _ in poller.poll(int(left * 1000) + 1):
                source = by_socket[sock]
                if source not in asked:
                    continue
                msg = self._clients[source].recv(0)  # None: a reply that did not decode
                ref = asked[source].pop(0)
                out[ref.group_id] = "mismatch" if msg is None else _verified(ref, msg)
                if not asked[source]:
                    del asked[source]
                    poller.unregister(sock)
        for source, wanted in asked.items():  # silent: a dead or wedged generator
            self._drop(source)  # replies that come later would be matched to new requests
            out.update({ref.group_id: "unreachable" for ref in wanted})

    def _client(self, source: str) -> Client:
        client = self._clients.get(source)
        if client is None:
            name = f"{self._name}-{next(_FETCHERS)}"  # never an identity the store saw
            client = Client(self.ctx, source, self.settings, self.security, name)
            self._clients[source] = client
        return client

    def _drop(self, source: str) -> None:
        client = self._clients.pop(source, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        for source in list(self._clients):
            self._drop(source)


def rollout_meta(rollout: m.Rollout, source: str, digest: str) -> RolloutMeta:
    """The generator's announcement of a Rollout it keeps in its store at `source`."""
    offsets = np.asarray(rollout.completion_offsets, dtype=np.int64)
    return RolloutMeta(
        lease_id=rollout.lease_id,
        group_id=rollout.group_id,
        instance=rollout.instance,
        policy_version=rollout.policy_version,
        source=source,
        digest=digest,
        prompt_len=len(rollout.prompt_ids),
        completion_lens=np.diff(offsets),
        truncated=list(rollout.truncated),
        gen_seconds=rollout.gen_seconds,
        sampling=rollout.sampling,
    )


def _verified(ref: PayloadRef, msg: m.Message) -> m.Rollout | str:
    if isinstance(msg, m.Error):
        return msg.code
    if not isinstance(msg, m.Rollout) or msg.group_id != ref.group_id:
        return "mismatch"
    if payload_digest(msg) != ref.digest:
        return "mismatch"
    return msg
