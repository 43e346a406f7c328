"""What every non-hub service shares: its link to the hub and its shutdown flag.

A service needs only the hub's address: `HubLink.connect` sends Hello and receives the run's
config and the peers' addresses in Welcome (the hub re-sends Welcome when peers change).
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
from types import FrameType
from typing import Any

import structlog

from grpo_stream.config import RunConfig, config_from_dict
from grpo_stream.logs import setup_logging
from grpo_stream.protocols import messages as m
from grpo_stream.transport.errors import TransportError
from grpo_stream.transport.settings import SecuritySettings, TransportSettings
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


class HubLink:
    """A DEALER connection to the hub with handshake and heartbeats."""

    def __init__(
        self,
        service: str,
        instance: str,
        hub: str,
        transport: TransportSettings,
        security: SecuritySettings,
        stop: StopFlag,
        rank: int = 0,
        capacity: int = 1,
        fingerprint: dict[str, Any] | None = None,
        log_setup: tuple[str, bool] = ("info", False),
    ) -> None:
        self.service = service
        self.log_setup = log_setup
        self.instance = instance
        self.hub = hub
        self.transport = transport
        self.security = security
        self.stop = stop
        self.rank = rank
        self.capacity = capacity
        self.fingerprint = dict(fingerprint or {})
        self.endpoints: dict[str, Any] = {}  # what this service serves (the trainer's weights)
        self.ctx = make_context()
        self.client = Client(self.ctx, hub, transport, security, identity=instance)
        self.peers: dict[str, Any] = {}
        self.cfg: RunConfig | None = None
        self.stats: dict[str, Any] = {}  # display-only counters in each heartbeat
        self.hub_rtt_s: float | None = None  # the last Hello -> Welcome round trip
        self.generator_stats: m.GeneratorStats | None = None  # set by a generator
        # Welcomes that answered our Hello: a new one means the hub (re)registered us and forgot
        # what we asked for, so ask for work again. The hub also sends Welcome unasked when
        # peers change (the trainer's weight server); those only update config and peers.
        self.joins = 0
        self._hellos_unanswered = 0
        self.policy_version = 0  # the trainer's version as the hub last told us
        self._hb_stop = threading.Event()
        self._rejoin_wanted = threading.Event()  # set by the heartbeat thread
        self._rejoined_at = -1e9
        self._hb: threading.Thread | None = None

    def connect(self) -> RunConfig:
        """Say Hello; return the run's config from Welcome."""
        welcome = self.introduce()
        assert self.cfg is not None
        # now that the run directory is known, log to its files too
        setup_logging(
            self.service,
            self.instance,
            self.cfg.run.run_dir,
            self.log_setup[0],
            console_json=self.log_setup[1],
        )
        log.info("hub.connected", hub=self.hub, run_id=welcome.run_id, digest=welcome.config_digest)
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
        welcome = handshake(self.client, self._hello(), self.transport.handshake_timeout_s)
        self.hub_rtt_s = round(time.perf_counter() - t0, 6)
        self._on_welcome(welcome, answered_hello=True)
        return welcome

    def _on_welcome(self, welcome: m.Welcome, answered_hello: bool) -> None:
        self.cfg = config_from_dict(dict(welcome.config))
        if answered_hello:
            self.joins += 1
        self._rejoined_at = -1e9  # welcomed: a later rejection needs a new Hello
        self.policy_version = max(self.policy_version, welcome.policy_version)
        self.peers = dict(welcome.peers)
        hb = self.cfg.transport
        self.transport = self.transport.model_copy(
            update={
                "heartbeat_interval_s": hb.heartbeat_interval_s,
                "heartbeat_timeout_s": hb.heartbeat_timeout_s,
            }
        )

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
        if isinstance(msg, m.Shutdown):
            log.info("hub.shutdown", reason=msg.reason)
            self.stop.stop(f"hub: {msg.reason}")
            return None
        if isinstance(msg, m.Error):
            log.warning("hub.error", code=msg.code, message=msg.message)
            if msg.code == "unregistered":
                self.rejoin()
            return None
        return msg

    def rejoin(self) -> None:
        """The hub does not know us (it restarted, or declared us lost): say Hello again.
        Several rejections arrive for one loss; one Hello per heartbeat deadline answers them."""
        now = time.monotonic()
        if now - self._rejoined_at < self.transport.heartbeat_timeout_s:
            return
        self._rejoined_at = now
        log.info("hub.rejoin", hub=self.hub)
        self.client.send(self._hello())
        self._hellos_unanswered += 1

    def _hello(self) -> m.Hello:
        return m.Hello(
            service=self.service,
            instance=self.instance,
            host=socket.gethostname(),
            pid=os.getpid(),
            capacity=self.capacity,
            rank=self.rank,
            fingerprint=self.fingerprint,
            endpoints=self.endpoints,
        )

    def _beat_loop(self) -> None:
        """Heartbeats from their own socket and thread, so a long model load or generation
        never looks like a dead process; a stopped (SIGSTOP) or killed one stops beating."""
        client = Client(
            self.ctx,
            self.hub,
            self.transport,
            self.security,
            identity=f"{self.instance}.hb.{os.getpid()}",
        )
        try:
            while not self._hb_stop.wait(self.transport.heartbeat_interval_s):
                try:
                    client.send(self._heartbeat())
                except TransportError as exc:  # the hub is away: keep trying
                    log.debug("heartbeat.failed", error=str(exc))
                reply = client.recv(0)
                while reply is not None:
                    if isinstance(reply, m.Error) and reply.code == "unregistered":
                        self._rejoin_wanted.set()  # the main loop says Hello again
                    reply = client.recv(0)
        finally:
            client.close()

    def _heartbeat(self) -> m.Heartbeat:
        return m.Heartbeat(
            instance=self.instance,
            stats=dict(self.stats),
            hub_rtt_s=self.hub_rtt_s,
            generator=self.generator_stats,
        )

    def close(self, reason: str) -> None:
        self._hb_stop.set()
        if self._hb is not None:
            self._hb.join(timeout=5)
        try:
            self.client.send(m.Shutdown(reason=reason))
        finally:
            self.client.close()
            close_context(self.ctx)
