"""The hub side of the session over real sockets: a Session joins a hub whose only logic is
`HubSessions`; strangers are told to say Hello, and cannot beat for someone else."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_stream.config import RunConfig, config_from_dict
from grpo_stream.config.transport import SecuritySettings
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.registry import Registry
from grpo_stream.hub.shares import ShareBook
from grpo_stream.protocols import messages as m
from grpo_stream.session.hub import HubSessions
from grpo_stream.session.service import Join, Session, StopFlag
from grpo_stream.transport.sockets import Client, Server, close_context, make_context


class Facts:
    run_id = "r"
    policy_version = 4


class Hub:
    """A ROUTER whose every message goes to HubSessions, from a thread; `refused` records
    what it refused."""

    def __init__(self, cfg: RunConfig) -> None:
        self.ctx = make_context()
        self.server = Server(self.ctx, cfg.hub.bind, cfg.transport, cfg.security, "hub")
        self.registry = Registry(cfg.transport.heartbeat_timeout_s)
        self.ledger = Ledger(1, 1, 10.0)
        self.refused: list[str] = []
        self.sessions = HubSessions(
            cfg, self.server, self.registry, self.ledger, ShareBook(cfg.hardware), Facts(),
            lambda identity, code, reason, kind: self.refused.append(code),
        )  # fmt: skip
        self.work: list[m.Message] = []  # what HubSessions handed back to the grouper
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            got = self.server.recv(10)
            if got is not None and self.sessions.handle(*got) is not None:
                self.work.append(got[1])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.server.close()
        close_context(self.ctx)


@pytest.fixture
def cfg(tmp_path: Path) -> RunConfig:
    transport = {"heartbeat_interval_s": 0.1, "heartbeat_timeout_s": 1.0}
    return config_from_dict({"run": {"run_dir": str(tmp_path)}, "transport": transport})


@pytest.fixture
def hub(cfg: RunConfig) -> Iterator[Hub]:
    h = Hub(cfg)
    yield h
    h.close()


def until(check: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (callable(check) and check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_session_joins_beats_and_pulls_credits_through_hub_sessions(hub: Hub) -> None:
    link = Session(Join("scorer", "sc-0", hub.server.address, SecuritySettings()), StopFlag())
    link.connect()
    try:
        assert link.digest == hub.sessions.digest and link.policy_version == 4
        link.stats["groups_scored"] = 9
        link.pull(5)
        until(lambda: hub.registry.peers["sc-0"].stats.get("groups_scored") == 9)  # a beat
        until(lambda: hub.registry.peers["sc-0"].credits == 5)
        time.sleep(1.5)  # past the heartbeat deadline: the beats keep it registered
        assert hub.sessions.expire(time.monotonic()) == [] and "sc-0" in hub.registry.peers
    finally:
        link.close("done")
    until(lambda: "sc-0" not in hub.registry.peers)  # Shutdown: it left
    assert not hub.sessions.trainer_done  # only the trainer's "done" ends the run


def test_a_message_from_an_unknown_identity_is_answered_unregistered(hub: Hub) -> None:
    stranger = Client(hub.ctx, hub.server.address, hub.server.settings, SecuritySettings(), "x")
    try:
        stranger.send(m.WorkRequest(instance="x", credits=3))
        reply = None
        deadline = time.monotonic() + 10
        while reply is None and time.monotonic() < deadline:
            reply = stranger.recv(50)
        assert isinstance(reply, m.Error) and reply.code == "unregistered"
        assert hub.server.rejected["unregistered"] == 1 and hub.work == []
    finally:
        stranger.close()


def test_a_heartbeat_from_another_socket_does_not_keep_a_peer_alive(hub: Hub) -> None:
    link = Session(Join("scorer", "sc-1", hub.server.address, SecuritySettings()), StopFlag())
    link.introduce()  # registered, but no heartbeat thread of its own
    spoof = Client(hub.ctx, hub.server.address, hub.server.settings, SecuritySettings(), "evil")
    try:
        for _ in range(20):
            spoof.send(m.Heartbeat(instance="sc-1", stats={}))
            time.sleep(0.1)
        until(lambda: hub.server.rejected["beat_spoofed"] == 20)
        assert [p.instance for p in hub.sessions.expire(time.monotonic())] == ["sc-1"]
    finally:
        spoof.close()
        link.close("done")


def test_a_hub_restarted_on_its_bound_port_welcomes_with_the_same_digest(cfg: RunConfig) -> None:
    first = Hub(cfg)  # binds port 0, as `up` starts it
    address = first.server.address
    first.close()
    again = config_from_dict({**cfg.model_dump(mode="json"), "hub": {"bind": address}})
    second = Hub(again)  # as `up` restarts it: --set hub.bind=<the bound address>
    try:
        assert cfg.digest() != again.digest()
        assert second.sessions.welcome().config_digest == first.sessions.welcome().config_digest
    finally:
        second.close()
