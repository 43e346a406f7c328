"""The service side of the session: join the hub, follow its Welcomes, beat, rejoin, pull work
with credits; and `run_service`, the one start-up every non-hub service shares.

A service needs only what `Join` holds: the hub's address, its keys, how long to wait for
Welcome. `Session.connect` says Hello; the first Welcome brings the run's config and with it
every transport setting (applied to the hub socket; the heartbeat socket and every socket the
service opens later are made from them). The config is then fixed: `Session.cfg` is the one
copy, and a later Welcome with another digest is refused (see `grpo_stream.session`).
A signal handler only records that shutdown was requested; loops check `StopFlag.set`.
On the way out the service says so (Shutdown) so the hub re-dispatches at once instead of
waiting for the heartbeat deadline.
"""

from __future__ import annotations

import contextvars
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import structlog

from grpo_stream import threads
from grpo_stream.config import ConfigError, RunConfig, config_from_dict
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.exits import EXIT_CONFIG_CHANGED
from grpo_stream.hub.auth import session_key, sign
from grpo_stream.logs import setup_logging
from grpo_stream.protocols import messages as m
from grpo_stream.ratelimit import RateLimit
from grpo_stream.session.identity import UNREGISTERED, beat_identity, session_identity
from grpo_stream.transport.errors import TransportError
from grpo_stream.transport.seal import BEATS, MAIN, Sealer
from grpo_stream.transport.sockets import Client, close_context, handshake, make_context

log = structlog.get_logger()


class StopFlag:
    """Set by SIGTERM/SIGINT or by a Shutdown from the hub."""

    def __init__(self) -> None:
        self.set = False
        self.reason = ""

    def install(self) -> StopFlag:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop(signal.Signals(signum).name)

    def stop(self, reason: str) -> None:
        self.set = True
        self.reason = self.reason or reason


class NotJoined(RuntimeError):
    """The run's config was asked for before the first Welcome (call `connect` first)."""


class ConfigMismatch(TransportError):
    """The hub's Welcome carries a config this service cannot run as the hub does."""


@dataclass(frozen=True)
class Join:
    """What a service needs to reach the hub; everything else comes in Welcome."""

    service: str
    instance: str
    hub: str
    security: SecuritySettings
    handshake_timeout_s: float | None = None
    """How long to wait for Welcome; None: `TransportSettings`' default, then the hub's."""
    rank: int = 0
    fingerprint: dict[str, Any] = field(default_factory=dict)
    log_setup: tuple[str, bool] = ("info", False)
    secret: bytes | None = field(default=None, repr=False)
    """The run's secret (`transport.runsecret.resolve_secret`): signs every Hello and keys
    the seal of every message after it. None: a hub without a secret (loopback demos)."""


class Session:
    """A DEALER connection to the hub with handshake, heartbeats, rejoin and credits."""

    def __init__(self, join: Join, stop: StopFlag, capacity: int = 1) -> None:
        self.join = join
        self.service = join.service
        self.instance = join.instance
        self.hub = join.hub
        self.security = join.security
        self.rank = join.rank
        self.stop = stop
        self.capacity = capacity
        self.fingerprint = dict(join.fingerprint)
        self.endpoints: m.Endpoints | None = None  # what this service serves (a trainer)
        # every Hello is signed with the run's secret when there is one (grpo_stream.hub.auth),
        # and every message after it sealed with the session key it opens
        self.secret = join.secret
        self._key: bytes | None = None  # the session key of the last Hello (with a secret)
        self._challenge = ""  # the hub's challenge our Hellos answer (from its Challenge)
        self._warn = RateLimit()
        self.ctx = make_context()
        # until the first Welcome: the defaults (small messages only: Hello and Welcome)
        self.transport = TransportSettings(**self._own())
        self.identity = session_identity(join.instance)
        self.client = Client(self.ctx, join.hub, self.transport, self.security, self.identity)
        self.peers: m.Endpoints | None = None  # the trainer's, from the last Welcome
        self.digest = ""  # the config digest this service runs (from its first Welcome)
        self.config_changed = False  # a later Welcome carried another digest: refused
        self.stats: dict[str, Any] = {}  # display-only counters in each heartbeat
        self.hub_rtt_s: float | None = None  # the last Hello -> Welcome round trip
        self.generator_stats: m.GeneratorStats | None = None  # set by a generator
        self.scorer_stats: m.ScorerStats | None = None  # set by a scorer
        self.farewell: str | None = None  # the Shutdown reason, when the service sets one
        # Welcomes that answered our Hello: a new one means the hub (re)registered us and forgot
        # what we asked for (see `_rejoined`). The hub also sends Welcome unasked when peers
        # change (the trainer's weight server); those only update peers.
        self.joins = 0
        self.policy_version = 0  # the trainer's version as the hub last told us
        self._cfg: RunConfig | None = None
        self._window = 0  # credits asked for again on every rejoin (`pull`)
        self._rejoin_hooks: list[Callable[[], None]] = []
        self._hellos_unanswered = 0
        self._hb_stop = threading.Event()
        self._rejoin_wanted = threading.Event()  # set by the heartbeat thread
        self._quiet_until = 0.0  # rejections before this answer messages from before a Hello
        self._hb: threading.Thread | None = None

    @property
    def cfg(self) -> RunConfig:
        """The run's config, from the first Welcome (the same for the session's life)."""
        if self._cfg is None:
            raise NotJoined(f"{self.instance}: no Welcome from {self.hub} yet: connect first")
        return self._cfg

    def connect(self) -> RunConfig:
        """Say Hello; return the run's config from Welcome."""
        welcome = self.introduce()
        # now that the run directory is known, log to its files too
        level, console_json = self.join.log_setup
        setup_logging(
            self.service, self.instance, self.cfg.run.run_dir, level, console_json=console_json
        )
        log.info(
            "hub.connected", hub=self.hub, run_id=welcome.run_id, digest=self.digest,
            identity=self.identity, sealed=self.secret is not None,
        )  # fmt: skip
        self._hb = threading.Thread(  # with this thread's bound log fields (service, instance)
            target=contextvars.copy_context().run,
            args=(self._beat_loop,),
            name="heartbeat",
            daemon=True,
        )
        self._hb.start()
        return self.cfg

    def introduce(self) -> m.Welcome:
        """Say Hello (again: to tell the hub new `endpoints`) and wait for its Welcome. The
        round trip goes to the hub in every heartbeat (`hub_rtt_s`: the latency term of the
        device score)."""
        t0 = time.perf_counter()
        welcome = handshake(
            self.client, self._hello(), self.transport.handshake_timeout_s, self._answer
        )
        self.hub_rtt_s = round(time.perf_counter() - t0, 6)
        self._on_welcome(welcome, answered_hello=True)
        return welcome

    # ----- credits and rejoin ---------------------------------------------------------
    def pull(self, window: int) -> None:
        """Ask for `window` credits of work now, and again after every rejoin."""
        self._window = window
        self.replenish(window)

    def replenish(self, credits: int) -> None:
        """Ask for `credits` more (one per unit of work just finished)."""
        self.send(m.WorkRequest(instance=self.instance, credits=credits))

    def on_rejoin(self, hook: Callable[[], None]) -> None:
        """Run `hook` after every rejoin, once the credit window was asked for again."""
        self._rejoin_hooks.append(hook)

    def _rejoined(self) -> None:
        log.info("hub.rejoined", joins=self.joins, credits=self._window)
        if self._window:
            self.replenish(self._window)
        for hook in self._rejoin_hooks:
            hook()

    # ----- Welcome --------------------------------------------------------------------
    def _on_welcome(self, welcome: m.Welcome, answered_hello: bool) -> None:
        if self._cfg is None:
            self._adopt(welcome)
        elif welcome.config_digest != self.digest:
            self._refuse(welcome)
            return
        if answered_hello:
            self.joins += 1
            # Rejections still in flight answer beats sent before the hub took our Hello: a
            # second Hello for them would make the hub forget what it just gave us. A hub
            # that forgets us again keeps rejecting every beat, so that is seen after this.
            self._rejoin_wanted.clear()
            self._quiet_until = time.monotonic() + 2 * self.transport.heartbeat_interval_s
        self.policy_version = max(self.policy_version, welcome.policy_version)
        self.peers = welcome.peers
        if answered_hello and self.joins > 1:
            self._rejoined()

    def _adopt(self, welcome: m.Welcome) -> None:
        """Take the run's config and its transport settings (all but the handshake timeout,
        which is this service's own: it is needed before any Welcome)."""
        try:
            cfg = config_from_dict(dict(welcome.config))
        except ConfigError as exc:
            raise ConfigMismatch(
                f"the hub at {self.hub} sent a config this {self.service} cannot read "
                f"(another grpo-stream version?): {exc}"
            ) from exc
        if cfg.digest() != welcome.config_digest:
            raise ConfigMismatch(
                f"the hub at {self.hub} says its config digest is {welcome.config_digest}, this "
                f"{self.service} reads the same config as {cfg.digest()}: hub and service run "
                "different grpo-stream versions"
            )
        self._cfg = cfg
        self.digest = welcome.config_digest
        self.transport = cfg.transport.model_copy(update=self._own())
        self.client.apply(self.transport)

    def _own(self) -> dict[str, float]:
        """The transport settings this service holds itself: how long it waits for Welcome."""
        wait = self.join.handshake_timeout_s
        return {} if wait is None else {"handshake_timeout_s": wait}

    def _refuse(self, welcome: m.Welcome) -> None:
        """The hub came back with another config: this process cannot switch (models, engines
        and sockets were built from the old one), so it stops and a restart takes the new one."""
        log.error(
            "session.config_changed",
            hub_digest=welcome.config_digest,
            digest=self.digest,
            hint="the hub restarted with another config: stopping so a restart takes it",
        )
        self.config_changed = True
        self.farewell = "config changed"
        self.stop.stop(f"config changed: the hub runs {welcome.config_digest}, not {self.digest}")

    # ----- messages -------------------------------------------------------------------
    def send(self, msg: m.Message) -> None:
        self.client.send(msg)

    def recv(self, timeout_ms: int) -> m.Message | None:
        """Next message for the service; Welcome, Shutdown and Error are handled here."""
        if self._rejoin_wanted.is_set():
            self._rejoin_wanted.clear()
            self.rejoin()
        msg = self.client.recv(timeout_ms)
        if isinstance(msg, m.Welcome):
            answered = self._hellos_unanswered > 0
            self._hellos_unanswered = max(0, self._hellos_unanswered - 1)
            self._on_welcome(msg, answered_hello=answered)
            return None
        if isinstance(msg, m.Challenge):
            if msg.in_reply_to == m.Hello.KIND:  # a hub that restarted: its new challenge
                log.info("hub.challenged", hub=self.hub)
                self.client.send(self._answer(msg.challenge))
            return None
        if isinstance(msg, m.Shutdown):
            log.info("hub.shutdown", reason=msg.reason)
            self.stop.stop(f"hub: {msg.reason}")
            return None
        if isinstance(msg, m.Error):
            if (count := self._warn.allow(f"hub.error:{msg.code}")) is not None:
                log.warning("hub.error", code=msg.code, message=msg.message, count=count)
            if msg.code == UNREGISTERED:
                self.rejoin()
            return None
        return msg

    def rejoin(self) -> None:
        """The hub does not know us (it restarted, or declared us lost): say Hello again.
        Several rejections arrive for one loss; one Hello per heartbeat deadline answers them
        (or, once welcomed, per what is still in flight: see `_on_welcome`)."""
        now = time.monotonic()
        if now < self._quiet_until:
            return
        self._quiet_until = now + self.transport.heartbeat_timeout_s
        log.info("hub.rejoin", hub=self.hub)
        self.client.send(self._hello())
        self._hellos_unanswered += 1

    def _answer(self, challenge: str) -> m.Hello:
        """A Hello signed for the hub's `challenge` (it answered ours with a Challenge)."""
        self._challenge = challenge
        return self._hello()

    def _hello(self) -> m.Hello:
        hello = m.Hello(
            service=self.service,
            instance=self.instance,
            host=socket.gethostname(),
            pid=os.getpid(),
            capacity=self.capacity,
            rank=self.rank,
            fingerprint=self.fingerprint,
            endpoints=self.endpoints,
        )
        if self.secret is None:
            return hello
        sign(hello, self.secret, self._challenge)
        # what follows this Hello on the main socket is sealed with the key it opens (the
        # Hello itself too: the hub checks the Hello's signature, not its seal)
        self._key = session_key(self.secret, hello)
        self.client.sealer = Sealer(self._key, MAIN)
        return hello

    def _heartbeat(self) -> m.Heartbeat:
        return m.Heartbeat(
            instance=self.instance,
            stats=dict(self.stats),
            hub_rtt_s=self.hub_rtt_s,
            generator=self.generator_stats,
            scorer=self.scorer_stats,
        )

    def _beat_loop(self) -> None:
        """Heartbeats from their own socket and thread, so a long model load or generation
        never looks like a dead process; a stopped (SIGSTOP) or killed one stops beating."""
        identity = beat_identity(self.identity)
        client = Client(self.ctx, self.hub, self.transport, self.security, identity)
        try:
            while not self._hb_stop.wait(self.transport.heartbeat_interval_s):
                key = self._key  # the main thread replaces it on each Hello
                if key is not None and (client.sealer is None or client.sealer.key != key):
                    client.sealer = Sealer(key, BEATS)
                try:
                    client.send(self._heartbeat())
                except TransportError as exc:  # the hub is away: keep trying
                    log.debug("heartbeat.failed", error=str(exc))
                reply = client.recv(0)
                while reply is not None:
                    if isinstance(reply, m.Error) and reply.code == UNREGISTERED:
                        self._rejoin_wanted.set()  # the main loop says Hello again
                    reply = client.recv(0)
        finally:
            client.close()

    def close(self, reason: str) -> None:
        self._hb_stop.set()
        if self._hb is not None:
            self._hb.join(timeout=5)
        try:
            self.client.send(m.Shutdown(reason=reason))
        finally:
            self.client.close()
            close_context(self.ctx)


def run_service(join: Join, body: Callable[[Session], int], heavy: bool = True) -> int:
    """Start a service: install the stop flag, import torch (`heavy`) before the heartbeats
    start (the import holds the GIL for seconds), join the hub, run `body(session)`, say
    Shutdown (reason: `session.farewell`, the stop reason, or "done"). Returns body's exit
    code, or `EXIT_CONFIG_CHANGED` when a Welcome with another config was refused."""
    stop = StopFlag().install()
    if heavy:
        threads.pin_from_env(os.environ)  # before torch makes its thread pools
        import torch  # noqa: F401
        import transformers  # noqa: F401
    session = Session(join, stop)
    try:
        cfg = session.connect()
    except BaseException:
        session.close("join failed")  # closes the sockets, or the process could not exit
        raise
    if heavy:
        threads.set_torch_threads(threads.plan_from_env(cfg.run.torch_threads, os.environ))
        log.info("service.threads", **threads.current())
    reason = "error"  # body raised
    try:
        code = body(session)
        reason = session.farewell or stop.reason or "done"
    finally:
        session.close(reason)
    return EXIT_CONFIG_CHANGED if session.config_changed else code
