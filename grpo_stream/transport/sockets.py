"""Thin wrappers over ZeroMQ sockets that speak grpo_stream.protocols messages.

Invariants:
- Every socket has its high-water marks, LINGER, send/receive timeouts and MAXMSGSIZE set
  explicitly (see `_configure`), so every hop is bounded and no call blocks forever.
- A malformed incoming message never raises: it is counted in `.rejected` by error code, logged
  (at most once per code per 10 s, with the number seen since), answered with `Error` where the
  socket can address the sender (ROUTER), and `recv` returns None. The socket keeps serving.
- `Server.send` never blocks: a peer whose queue is at the high-water mark, or that is gone,
  does not get the message; the drop is counted in `.dropped` by reason, logged (rate-limited)
  and `send` returns False. One slow peer can never stall a server that serves many.
- `Client.send` waits at most transport.io_timeout_ms for room, then raises `SendTimeout`: a
  service whose only peer does not drain has nothing better to do than notice.
- `recv(timeout_ms)` may return None before the timeout (a malformed message was dropped);
  loops keep their own deadline.
- A frame over transport.max_frame_bytes never reaches Python: libzmq (MAXMSGSIZE) drops the
  connection of the peer that sent it, so it is neither counted nor answered.
- With security.curve on, a context must be closed with `close_context` (it stops the
  authenticator thread first; a bare `ctx.term()` would wait for that thread forever).
- Nothing binds beyond loopback unguarded: a binding socket (hub, weight server, relay,
  payload store) whose address is not loopback refuses to open unless security.curve is on
  or its owner holds the run's secret (`guarded`), with one line naming the settings
  (`grpo_stream.transport.exposure`).
- A `Client` with a `sealer` sends a seal frame before each message
  (`grpo_stream.transport.seal`); a `Server` takes a seal frame off what it receives and
  keeps it in `last_seal` for its owner to check.
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

import structlog
import zmq

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.protocols.codec import Limits, decode, encode
from grpo_stream.protocols.errors import ProtocolError
from grpo_stream.protocols.messages import Challenge, Error, Hello, Message, Welcome
from grpo_stream.ratelimit import LOG_EVERY_S, RateLimit
from grpo_stream.transport.curve import secure_client, secure_server, stop_authenticator
from grpo_stream.transport.errors import ExposedBind
from grpo_stream.transport.errors import HandshakeRefused as HandshakeRefused
from grpo_stream.transport.errors import HandshakeTimeout as HandshakeTimeout
from grpo_stream.transport.errors import SendTimeout as SendTimeout
from grpo_stream.transport.errors import TransportError as TransportError
from grpo_stream.transport.exposure import exposure_error
from grpo_stream.transport.heartbeat import Heartbeats as Heartbeats
from grpo_stream.transport.heartbeat import HeartbeatSender as HeartbeatSender
from grpo_stream.transport.seal import Seal, Sealer, is_seal, parse

log = structlog.get_logger()

Context = zmq.Context[Any]
Socket = zmq.Socket[Any]


def make_context() -> Context:
    """A fresh ZeroMQ context (one per process; sockets are per thread)."""
    return zmq.Context()


def close_context(ctx: Context) -> None:
    """Stop the context's CURVE authenticator, close any socket left open, terminate.

    Call it once the threads that use the context's sockets have stopped.
    """
    stop_authenticator(ctx)
    ctx.destroy(linger=0)


class SendStatus(enum.Enum):
    SENT = "sent"
    FULL = "full"  # the peer's queue is at the high-water mark
    UNREACHABLE = "unreachable"  # no connected peer has this identity


def _peer_name(identity: bytes | None) -> str | None:
    return None if identity is None else identity.decode("utf-8", errors="backslashreplace")


def _configure(sock: Socket, settings: TransportSettings) -> None:
    # Bound the queue per peer in each direction: a slow consumer makes its sender hit the
    # mark (PUB drops, ROUTER reports FULL, DEALER waits then raises) instead of growing memory.
    sock.setsockopt(zmq.SNDHWM, settings.hwm)
    sock.setsockopt(zmq.RCVHWM, settings.hwm)
    # Closing never waits for messages to a dead peer, so shutdown cannot hang.
    sock.setsockopt(zmq.LINGER, settings.linger_ms)
    # A raw socket.recv/send (e.g. by a caller using .socket) fails after this instead of
    # blocking forever; our recv() polls with the caller's timeout first.
    sock.setsockopt(zmq.RCVTIMEO, settings.io_timeout_ms)
    sock.setsockopt(zmq.SNDTIMEO, settings.io_timeout_ms)
    # libzmq checks this per frame while reading from the wire and disconnects a peer that
    # announces a larger frame *before allocating it*; the codec then checks the whole
    # message against max_message_bytes. So the per-frame limit is the right value here.
    sock.setsockopt(zmq.MAXMSGSIZE, settings.max_frame_bytes)


Options = list[tuple[int, int | bytes]]
"""Socket options a wrapper sets before it binds or connects, each with its reason beside it."""


class _Endpoint:
    """What every wrapper shares: the socket, limits, decoding with counted rejections.
    A subclass names its socket type and options; `_open` binds or connects it."""

    SOCKET_TYPE: ClassVar[int]

    def __init__(
        self,
        ctx: Context,
        address: str,
        settings: TransportSettings,
        security: SecuritySettings,
        name: str,
    ) -> None:
        self.name = name
        self.rejected: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self._throttle = RateLimit(LOG_EVERY_S)
        self.socket: Socket = ctx.socket(self.SOCKET_TYPE)
        self.apply(settings)
        for option, value in self._options():
            self.socket.setsockopt(option, value)
        self.address = address
        self._open(ctx, security)

    def _options(self) -> Options:
        return []

    def _open(self, ctx: Context, security: SecuritySettings) -> None:
        raise NotImplementedError

    def apply(self, settings: TransportSettings) -> None:
        """Use `settings` from now on (a service adopts the hub's on Welcome). libzmq applies
        HWM, LINGER and the timeouts to live connections too; MAXMSGSIZE only to connections
        made after this call, so on a live one the codec's limits below are what changes."""
        self.settings = settings
        self._limits = Limits(
            max_message_bytes=settings.max_message_bytes, max_frame_bytes=settings.max_frame_bytes
        )
        _configure(self.socket, settings)

    def _decode(self, frames: list[zmq.Frame], peer: bytes | None) -> Message | ProtocolError:
        try:
            return decode(frames, self._limits)
        except ProtocolError as exc:
            self.rejected[exc.code] += 1
            count = self._throttle.allow(f"rejected:{exc.code}", time.monotonic())
            if count is not None:
                log.warning(
                    "transport.rejected",
                    socket=self.name,
                    code=exc.code,
                    error=str(exc),
                    peer=_peer_name(peer),
                    count=count,
                    total=self.rejected[exc.code],
                )
            return exc

    def _note_drop(self, reason: str, msg: Message, peer: bytes | None = None) -> None:
        self.dropped[reason] += 1
        count = self._throttle.allow(f"dropped:{reason}", time.monotonic())
        if count is not None:
            log.warning(
                "transport.dropped",
                socket=self.name,
                reason=reason,
                kind=type(msg).__name__,
                peer=_peer_name(peer),
                count=count,
                total=self.dropped[reason],
            )

    def _poll_frames(self, timeout_ms: int) -> list[zmq.Frame] | None:
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        try:
            return self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None

    def close(self) -> None:
        self.socket.close(linger=self.settings.linger_ms)


class _Bound(_Endpoint):
    """A socket that binds (CURVE server side); `.address` is the bound one (port 0 resolved).
    `guarded`: its owner holds the run's secret; `setting` names the address's setting in
    the refusal to bind beyond loopback unguarded."""

    def __init__(
        self,
        ctx: Context,
        address: str,
        settings: TransportSettings,
        security: SecuritySettings,
        name: str,
        guarded: bool = False,
        setting: str = "",
    ) -> None:
        self._guarded = guarded
        self._setting = setting or f"{name} bind"
        super().__init__(ctx, address, settings, security, name)

    def _open(self, ctx: Context, security: SecuritySettings) -> None:
        refused = exposure_error(self.address, security, self._guarded, self._setting)
        if refused:
            self.socket.close(linger=0)
            raise ExposedBind(refused)
        secure_server(ctx, self.socket, security)
        try:
            self.socket.bind(self.address)
        except zmq.ZMQError as exc:
            self.socket.close(linger=0)
            raise TransportError(f"{self.name}: cannot bind {self.address}: {exc}") from exc
        self.address = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)  # resolves port 0
        kind = "router" if self.SOCKET_TYPE == zmq.ROUTER else "pub"
        log.info("transport.bound", socket=self.name, type=kind, address=self.address)


class _Connected(_Endpoint):
    """A socket that connects to one address (CURVE client side) and receives messages."""

    def _open(self, ctx: Context, security: SecuritySettings) -> None:
        secure_client(self.socket, security)
        self.socket.connect(self.address)

    def recv(self, timeout_ms: int) -> Message | None:
        """The next message, or None on timeout or after dropping a malformed one."""
        frames = self._poll_frames(timeout_ms)
        if frames is None:
            return None
        msg = self._decode(frames, None)
        return None if isinstance(msg, ProtocolError) else msg


class Server(_Bound):
    """ROUTER that binds: answers many identified peers. Server(ctx, bind, settings,
    security, name, guarded, setting)."""

    SOCKET_TYPE = zmq.ROUTER

    def _options(self) -> Options:
        return [
            # A send to a full or unknown peer raises instead of vanishing, so drops are counted.
            (zmq.ROUTER_MANDATORY, 1),
            # No handover: a second connection claiming an identity in use is refused, so a
            # stranger cannot take a live peer's connection (and its TrainBatches). A restarted
            # peer still gets its identity back: its dead process's connection closed with it.
            (zmq.ROUTER_HANDOVER, 0),
        ]

    def _open(self, ctx: Context, security: SecuritySettings) -> None:
        super()._open(ctx, security)
        self._curve = security.curve
        self.last_user_id: str | None = None
        """Under CURVE, the public key (z85) the last received message's sender authenticated
        with (ZAP User-Id); None without CURVE."""
        self.last_seal: Seal | None = None
        """The seal the last received message came with (None: none, or a malformed one)."""

    def recv(self, timeout_ms: int) -> tuple[bytes, Message] | None:
        """(identity, message), or None on timeout or after rejecting a malformed message."""
        frames = self._poll_frames(timeout_ms)
        if frames is None:
            return None
        identity = frames[0].bytes
        self.last_user_id = str(frames[-1].get("User-Id")) if self._curve else None
        body = frames[1:]
        self.last_seal = None
        if len(body) > 1 and is_seal(body[0].buffer):  # a seal, then the message's frames
            views = [f.buffer for f in body[1:]]
            self.last_seal = parse(body[0].buffer, views)
            body = body[1:]
        msg = self._decode(body, identity)
        if isinstance(msg, ProtocolError):
            self.send(identity, Error(code=msg.code, message=str(msg), in_reply_to=msg.kind))
            return None
        return identity, msg

    def try_send(self, identity: bytes, msg: Message) -> SendStatus:
        """Queue `msg` for `identity` without blocking; counts nothing."""
        try:
            self.socket.send_multipart([identity, *encode(msg)], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return SendStatus.FULL
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return SendStatus.UNREACHABLE
            raise
        return SendStatus.SENT

    def send(self, identity: bytes, msg: Message) -> bool:
        """Queue `msg` for `identity`; False (counted in .dropped, logged) if it was dropped."""
        status = self.try_send(identity, msg)
        if status is not SendStatus.SENT:
            self._note_drop(status.value, msg, identity)
        return status is SendStatus.SENT


class Client(_Connected):
    """DEALER that connects to one Server under a stable identity. Client(ctx, connect,
    settings, security, identity)."""

    SOCKET_TYPE = zmq.DEALER
    sealer: Sealer | None = None
    """Seals every message sent (a service's session with a hub that has the run's secret)."""

    @property
    def identity(self) -> str:
        return self.name

    def _options(self) -> Options:
        # The server addresses replies by this; unique per process, stable across reconnects.
        return [(zmq.IDENTITY, self.name.encode())]

    def send(self, msg: Message) -> None:
        """Queue `msg`; raises SendTimeout when no room came within transport.io_timeout_ms."""
        frames = encode(msg)
        if self.sealer is not None:
            frames = [self.sealer.seal(frames), *frames]
        try:
            self.socket.send_multipart(frames, copy=False)
        except zmq.Again as exc:
            raise SendTimeout(
                f"{self.identity}: could not queue {type(msg).__name__} for {self.address} "
                f"within transport.io_timeout_ms={self.settings.io_timeout_ms}"
            ) from exc


class Announcer(_Bound):
    """PUB that binds: broadcasts small announcements (a slow subscriber misses some).
    Announcer(ctx, bind, settings, security, name, guarded, setting)."""

    SOCKET_TYPE = zmq.PUB

    def publish(self, msg: Message) -> None:
        """Send to every subscriber; never blocks (PUB drops for a subscriber at its HWM)."""
        try:
            self.socket.send_multipart(encode(msg), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self._note_drop("full", msg)


class Subscriber(_Connected):
    """SUB that connects to an Announcer and receives everything it publishes.

    No CONFLATE: libzmq's conflation breaks multipart messages. A reader that wants only the
    newest announcement drains with `recv(0)` until None (see fetch.WeightsWatcher).
    Subscriptions take a moment to reach the publisher, so the first announcements after
    connecting can be missed; announcements are hints, never the only way to learn state.
    Subscriber(ctx, connect, settings, security, name).
    """

    SOCKET_TYPE = zmq.SUB

    def _options(self) -> Options:
        return [(zmq.SUBSCRIBE, b"")]


MAX_CHALLENGES = 3
"""Challenges one handshake answers (a hub answers a Hello signed for its own at once)."""


def handshake(
    client: Client,
    hello: Hello,
    timeout_s: float,
    resign: Callable[[str], Hello] | None = None,
) -> Welcome:
    """Send Hello and wait for the hub's Welcome. A hub with the run's secret answers a Hello
    that does not answer its challenge with `Challenge`: `resign(challenge)` gives the Hello
    signed for it, sent in its place.

    Raises HandshakeRefused when the hub answers with Error (or a Challenge without
    `resign`, or too many), HandshakeTimeout (naming the address and
    transport.handshake_timeout_s) when nothing usable arrives in time.
    """
    client.send(hello)
    challenged = 0
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        reply = client.recv(max(1, int(left * 1000)))
        if isinstance(reply, Welcome):
            log.info("transport.handshake_done", address=client.address)
            return reply
        if isinstance(reply, Challenge) and resign is not None and challenged < MAX_CHALLENGES:
            challenged += 1
            client.send(resign(reply.challenge))
            continue
        if isinstance(reply, Challenge):
            raise HandshakeRefused(
                f"hub at {client.address} asks for a Hello signed with the run's secret "
                "(give this service --secret-file or GRPO_STREAM_SECRET)",
                code="challenge",
            )
        if isinstance(reply, Error):
            raise HandshakeRefused(
                f"hub at {client.address} refused Hello: {reply.message} ({reply.code})",
                code=reply.code,
            )
        if reply is not None:
            log.warning("transport.handshake_unexpected", kind=type(reply).__name__)
    raise HandshakeTimeout(
        f"no Welcome from {client.address} within {timeout_s:g} s: is the hub running there "
        "(and with security.curve on, are the keys right)? "
        "Raise --handshake-timeout (transport.handshake_timeout_s) to wait longer"
    )
