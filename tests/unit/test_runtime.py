"""HubLink against a real ROUTER socket standing in for the hub: which Welcomes mean
"you were (re)registered, ask for work again" and which only update peers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_stream.config import RunConfig
from grpo_stream.protocols import messages as m
from grpo_stream.runtime import HubLink, StopFlag
from grpo_stream.transport.settings import SecuritySettings, TransportSettings
from grpo_stream.transport.sockets import Server, close_context, make_context


class FakeHub:
    """Answers every Hello with Welcome from a thread; records what it received."""

    def __init__(self, run_dir: Path) -> None:
        self.ctx = make_context()
        self.server = Server(
            self.ctx, "tcp://127.0.0.1:0", TransportSettings(), SecuritySettings(), name="hub"
        )
        cfg = RunConfig()
        cfg.run.run_dir = str(run_dir)
        self.config = cfg.model_dump(mode="json")
        self.hellos: list[m.Hello] = []
        self.identity = b""
        self.peers: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._lock = threading.Lock()
        self._thread.start()

    def welcome(self) -> m.Welcome:
        return m.Welcome(
            run_id="r", config=self.config, config_digest="d", peers=dict(self.peers),
            policy_version=0,
        )  # fmt: skip

    def _loop(self) -> None:
        while not self._stop.is_set():
            got = self.server.recv(20)
            if got is None:
                continue
            identity, msg = got
            if isinstance(msg, m.Hello):
                with self._lock:
                    self.hellos.append(msg)
                    self.identity = identity
                    self.server.send(identity, self.welcome())

    def broadcast(self, peers: dict[str, str]) -> None:
        """What the hub does when the trainer announces its weight server."""
        with self._lock:
            self.peers = peers
            self.server.send(self.identity, self.welcome())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.server.close()
        close_context(self.ctx)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    fake = FakeHub(tmp_path)
    yield fake
    fake.close()


@pytest.fixture
def link(hub: FakeHub) -> Iterator[HubLink]:
    settings, security = TransportSettings(), SecuritySettings()
    link = HubLink("generator", "gen-0", hub.server.address, settings, security, StopFlag())
    link.connect()
    yield link
    link.close("test")


def _drain(link: HubLink, seconds: float = 1.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        link.recv(timeout_ms=20)


def test_connect_counts_one_join_and_measures_the_round_trip(link: HubLink, hub: FakeHub) -> None:
    assert link.joins == 1
    assert len(hub.hellos) == 1
    rtt = link.hub_rtt_s
    assert rtt is not None and 0 < rtt < 30
    assert link._heartbeat().hub_rtt_s == rtt  # sent to the hub with every heartbeat


def test_unasked_welcome_updates_peers_without_a_new_join(link: HubLink, hub: FakeHub) -> None:
    hub.broadcast({"weights": "tcp://127.0.0.1:9"})
    _drain(link)
    assert link.peers == {"weights": "tcp://127.0.0.1:9"}
    assert link.joins == 1  # nothing was forgotten: do not ask for work twice


def test_welcome_answering_a_rejoin_is_a_new_join(link: HubLink, hub: FakeHub) -> None:
    link.rejoin()
    _drain(link)
    assert len(hub.hellos) == 2
    assert link.joins == 2


def test_introduce_sends_endpoints_and_consumes_its_welcome(link: HubLink, hub: FakeHub) -> None:
    link.endpoints = {"weights": "tcp://127.0.0.1:7"}
    link.introduce()
    assert hub.hellos[-1].endpoints == {"weights": "tcp://127.0.0.1:7"}
    joins = link.joins
    _drain(link, 0.3)
    assert link.joins == joins  # its Welcome was taken by introduce, none is left over
