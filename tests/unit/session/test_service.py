"""The service side of the session against a real ROUTER socket standing in for the hub: what
a Welcome applies, which Welcomes mean "you were (re)registered", what a rejoin asks for again,
and that a Welcome with another config digest is refused."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from grpo_stream.config import RunConfig, config_from_dict
from grpo_stream.config.transport import SecuritySettings
from grpo_stream.exits import EXIT_CONFIG_CHANGED
from grpo_stream.protocols import messages as m
from grpo_stream.session.service import (
    ConfigMismatch,
    Join,
    NotJoined,
    Session,
    StopFlag,
    run_service,
)

sys.path.insert(0, str(Path(__file__).parent))
from hub_script import ScriptedHub


def run_config(run_dir: Path, seed: int = 0) -> RunConfig:
    """Fast heartbeats and transport settings unlike the defaults, so a test sees whose apply."""
    return config_from_dict(
        {
            "run": {"run_dir": str(run_dir), "seed": seed},
            "transport": {
                "heartbeat_interval_s": 0.1, "heartbeat_timeout_s": 1.0, "hwm": 37,
                "io_timeout_ms": 1234, "handshake_timeout_s": 33.0,
            },
        }
    )  # fmt: skip


@pytest.fixture
def cfg(tmp_path: Path) -> RunConfig:
    return run_config(tmp_path)


@pytest.fixture
def hub(cfg: RunConfig) -> Iterator[ScriptedHub]:
    fake = ScriptedHub(cfg)
    yield fake
    fake.close()


def join(hub: ScriptedHub, wait: float | None = None) -> Join:
    return Join("generator", "gen-0", hub.address, SecuritySettings(), handshake_timeout_s=wait)


@pytest.fixture
def session(hub: ScriptedHub) -> Iterator[Session]:
    link = Session(join(hub), StopFlag())
    link.connect()
    yield link
    link.close("test")


def pump(link: Session, seconds: float, until: object = None) -> None:
    """Let the session take its messages for `seconds` (or until `until()` is true)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (callable(until) and until()):
        link.recv(timeout_ms=20)


def restart(hub: ScriptedHub, cfg: RunConfig) -> ScriptedHub:
    hub.close()
    return ScriptedHub(cfg, address=hub.address)


def test_connect_counts_one_join_and_measures_the_round_trip(
    session: Session, hub: ScriptedHub
) -> None:
    assert session.joins == 1
    assert len(hub.of(m.Hello)) == 1
    rtt = session.hub_rtt_s
    assert rtt is not None and 0 < rtt < 30
    assert session._heartbeat().hub_rtt_s == rtt  # sent to the hub with every heartbeat


def test_cfg_before_the_first_welcome_raises_not_joined(hub: ScriptedHub) -> None:
    link = Session(join(hub), StopFlag())
    with pytest.raises(NotJoined, match="connect first"):
        link.cfg  # noqa: B018
    link.close("test")


def test_welcome_applies_the_hubs_transport_settings(session: Session, cfg: RunConfig) -> None:
    assert session.transport == cfg.transport
    assert session.client.socket.getsockopt(zmq.SNDHWM) == 37
    assert session.client.socket.getsockopt(zmq.RCVTIMEO) == 1234


def test_heartbeats_follow_the_interval_from_welcome(session: Session, hub: ScriptedHub) -> None:
    time.sleep(1.0)
    assert len(hub.of(m.Heartbeat)) >= 5  # every 0.1 s; the default (1 s) would give one


def test_the_handshake_timeout_given_to_the_service_stays_its_own(hub: ScriptedHub) -> None:
    link = Session(join(hub, wait=7.5), StopFlag())
    link.connect()
    assert link.transport.handshake_timeout_s == 7.5  # not the hub's 33
    assert link.transport.hwm == 37  # the rest is the hub's
    link.close("test")


def test_a_first_welcome_whose_digest_is_not_its_configs_is_refused(cfg: RunConfig) -> None:
    hub = ScriptedHub(cfg, digest="0123456789abcdef")
    link = Session(join(hub), StopFlag())
    try:
        with pytest.raises(ConfigMismatch, match=f"0123456789abcdef.*{cfg.digest()}"):
            link.connect()
    finally:
        link.close("test")
        hub.close()


def test_unasked_welcome_updates_peers_without_a_new_join(
    session: Session, hub: ScriptedHub
) -> None:
    hub.peers = m.Endpoints(weights="tcp://127.0.0.1:9", announce="tcp://127.0.0.1:8")
    hub.send("gen-0", hub.welcome())  # what the hub does when the trainer announces itself
    pump(session, 1.0, until=lambda: session.peers)
    assert session.peers == hub.peers
    assert session.joins == 1  # nothing was forgotten: do not ask for work twice


def test_introduce_sends_endpoints_and_consumes_its_welcome(
    session: Session, hub: ScriptedHub
) -> None:
    session.endpoints = m.Endpoints(weights="tcp://127.0.0.1:7", announce="tcp://127.0.0.1:6")
    session.introduce()
    assert hub.of(m.Hello)[-1].endpoints == session.endpoints  # type: ignore[attr-defined]
    joins = session.joins
    pump(session, 0.3)
    assert session.joins == joins  # its Welcome was taken by introduce, none is left over


def test_rejoin_after_a_hub_restart_asks_for_the_credit_window_again(
    session: Session, hub: ScriptedHub, cfg: RunConfig
) -> None:
    rejoined: list[int] = []
    session.on_rejoin(lambda: rejoined.append(session.joins))
    session.pull(3)
    session.replenish(1)
    hub.wait_for(m.WorkRequest, count=2)
    hub = restart(hub, cfg)
    try:
        pump(session, 15.0, until=lambda: rejoined)
        asked = hub.wait_for(m.WorkRequest, timeout_s=5.0)
        assert [w.credits for w in asked] == [3]  # type: ignore[attr-defined]
        assert rejoined == [2] and len(hub.of(m.Hello)) == 1
    finally:
        hub.close()


def test_a_welcome_with_another_digest_after_a_restart_stops_the_service(
    session: Session, hub: ScriptedHub, tmp_path: Path
) -> None:
    digest = session.digest
    other = run_config(tmp_path, seed=1)
    hub = restart(hub, other)
    try:
        pump(session, 15.0, until=lambda: session.stop.set)
        assert session.config_changed
        assert other.digest() in session.stop.reason and digest in session.stop.reason
        assert session.cfg.run.seed == 0 and session.digest == digest  # not adopted
    finally:
        hub.close()


def test_run_service_exits_with_config_changed_and_tells_the_hub(
    hub: ScriptedHub, tmp_path: Path, keep_signals: None
) -> None:
    hubs = [hub]

    def change_config() -> None:  # once the service runs, the hub comes back reconfigured
        hub.wait_for(m.WorkRequest)
        hubs.append(restart(hub, run_config(tmp_path, seed=1)))

    def body(link: Session) -> int:
        link.pull(1)
        threading.Thread(target=change_config, daemon=True).start()
        pump(link, 20.0, until=lambda: link.stop.set)
        return 0

    try:
        assert run_service(join(hub), body, heavy=False) == EXIT_CONFIG_CHANGED
        bye = hubs[-1].wait_for(m.Shutdown, timeout_s=5.0)
        assert bye[0].reason == "config changed"  # type: ignore[attr-defined]
    finally:
        hubs[-1].close()


def test_a_session_given_the_runs_secret_signs_every_hello_for_the_hubs_challenge(
    tmp_path: Path,
) -> None:
    from grpo_stream.hub.auth import HelloAuth, load_secret, write_secret

    secret = load_secret(write_secret(tmp_path / "secret"))
    auth = HelloAuth(secret)
    hub = ScriptedHub(run_config(tmp_path), challenge=auth.challenge)
    try:
        join = Join("generator", "gen-1", hub.address, SecuritySettings(), secret=secret)
        link = Session(join, StopFlag())
        link.connect()  # its first Hello answers no challenge: challenged, then signed again
        link.introduce()  # a second Hello (as the trainer's, announcing endpoints)
        hellos = hub.wait_for(m.Hello, count=3, timeout_s=5.0)
        link.close("test")
    finally:
        hub.close()
    assert auth.stale(hellos[0].auth)
    assert [auth.check(h) for h in hellos[1:]] == [None, None]  # each with its own nonce


def test_repeated_errors_from_the_hub_are_logged_rate_limited(
    session: Session, hub: ScriptedHub
) -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        for _ in range(10):
            hub.send("gen-0", m.Error(code="bad_rollout", message="G=8"))
        pump(session, 0.5)
    said = [e for e in logs if e["event"] == "hub.error"]
    assert len(said) == 1 and said[0]["count"] == 1
