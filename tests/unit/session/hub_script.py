"""A scripted hub for session and service tests: a real ROUTER socket served from a thread.

It answers Hello with a Welcome carrying its config and that config's real digest, answers a
heartbeat from an instance it does not know with Error("unregistered") as the hub does, and
records every message. The test sends work through `send` (the socket stays in its thread).
Restart it by closing it and making a new one on the same `address`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from grpo_stream.config import RunConfig
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.protocols import messages as m
from grpo_stream.transport.sockets import Server, close_context, make_context


class ScriptedHub:
    def __init__(
        self,
        cfg: RunConfig,
        address: str = "tcp://127.0.0.1:0",
        digest: str | None = None,
        challenge: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.challenge = challenge  # a hub with the run's secret: Hellos must answer it
        self.digest = cfg.digest() if digest is None else digest
        self.ctx = make_context()
        self.server = Server(self.ctx, address, TransportSettings(), SecuritySettings(), "hub")
        self.address = self.server.address
        self.received: list[m.Message] = []
        self.known: dict[str, bytes] = {}  # instance -> identity, from Hello
        self.peers: m.Endpoints | None = None
        self._out: queue.Queue[tuple[str, m.Message]] = queue.Queue()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def welcome(self) -> m.Welcome:
        return m.Welcome(
            run_id="scripted", config=self.cfg.model_dump(mode="json"),
            config_digest=self.digest, peers=self.peers, policy_version=0,
        )  # fmt: skip

    def send(self, instance: str, msg: m.Message) -> None:
        """Queue `msg` for a registered instance (sent from the hub's thread)."""
        self._out.put((instance, msg))

    def of(self, kind: type[m.Message]) -> list[m.Message]:
        with self._lock:
            return [msg for msg in self.received if isinstance(msg, kind)]

    def wait_for(
        self, kind: type[m.Message], count: int = 1, timeout_s: float = 30.0,
        where: Callable[[m.Message], bool] = lambda msg: True,
    ) -> list[m.Message]:  # fmt: skip
        """The first `count` messages of `kind` (matching `where`), waiting up to timeout_s."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = [msg for msg in self.of(kind) if where(msg)]
            if len(got) >= count:
                return got[:count]
            time.sleep(0.02)
        raise AssertionError(f"{count} {kind.__name__} did not come in {timeout_s} s: {got}")

    def _challenged(self, hello: m.Hello) -> bool:
        """Whether `hello` answers another challenge than this hub's (when it has one)."""
        return self.challenge is not None and hello.auth.split(":")[3:4] != [self.challenge]

    def _loop(self) -> None:
        while not self._stop.is_set():
            while not self._out.empty():
                instance, msg = self._out.get()
                self.server.send(self.known[instance], msg)
            got = self.server.recv(10)
            if got is None:
                continue
            identity, msg = got
            with self._lock:
                self.received.append(msg)
            if isinstance(msg, m.Hello) and self._challenged(msg):
                challenge = m.Challenge(challenge=self.challenge or "", in_reply_to="hello")
                self.server.send(identity, challenge)
            elif isinstance(msg, m.Hello):
                self.known[msg.instance] = identity
                self.server.send(identity, self.welcome())
            elif isinstance(msg, m.Heartbeat) and msg.instance not in self.known:
                unknown = m.Error(code="unregistered", message="send Hello first")
                self.server.send(identity, unknown)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.server.close()
        close_context(self.ctx)
