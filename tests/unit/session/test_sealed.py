"""Sessions under the run's secret, over real sockets: every message after Hello is sealed
with the session's key; a stranger who gets a peer's identity after it died cannot act as
it; status needs the status key."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_stream.config import RunConfig, config_from_dict
from grpo_stream.config.transport import SecuritySettings
from grpo_stream.hub.auth import sign_status, status_key
from grpo_stream.protocols import messages as m
from grpo_stream.session.hub import HubSessions
from grpo_stream.session.identity import UNREGISTERED
from grpo_stream.session.service import Join, Session, StopFlag
from grpo_stream.transport.seal import MAIN, Sealer
from grpo_stream.transport.sockets import Client

from .test_hub import Hub, until

SECRET = b"a" * 64


class SealedHub(Hub):
    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.gone: list[tuple[str, str]] = []
        self.sessions = HubSessions(
            cfg, self.server, self.registry, self.ledger, self.sessions.shares, self.sessions.facts,
            lambda identity, code, reason, kind: self.refused.append(code), SECRET,
        )  # fmt: skip
        self.sessions.on_gone.append(lambda peer, why: self.gone.append((peer.instance, why)))


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[SealedHub]:
    transport = {"heartbeat_interval_s": 0.1, "heartbeat_timeout_s": 1.0}
    h = SealedHub(config_from_dict({"run": {"run_dir": str(tmp_path)}, "transport": transport}))
    yield h
    h.close()


def join(hub: Hub, instance: str) -> Session:
    link = Session(Join("scorer", instance, hub.server.address, SecuritySettings(),
                        secret=SECRET), StopFlag())  # fmt: skip
    link.connect()
    return link


def test_a_sealed_session_joins_beats_and_pulls_credits(hub: SealedHub) -> None:
    link = join(hub, "sc-0")
    try:
        assert link.identity.startswith("sc-0.") and link.identity != "sc-0"
        link.stats["groups_scored"] = 3
        link.pull(5)
        until(lambda: hub.registry.peers["sc-0"].credits == 5)
        until(lambda: hub.registry.peers["sc-0"].stats.get("groups_scored") == 3)  # sealed beat
        assert hub.refused == [] and hub.server.rejected["beat_bad_seal"] == 0
    finally:
        link.close("done")


def test_a_stranger_with_a_dead_peers_identity_is_refused_and_the_peer_dropped(
    hub: SealedHub,
) -> None:
    link = join(hub, "sc-1")
    link.pull(2)
    until(lambda: hub.registry.peers["sc-1"].credits == 2)
    link._hb_stop.set()  # as if killed: no Shutdown, its connections gone
    link.client.socket.close(linger=0)
    forged = Sealer(bytes(32), MAIN)  # a seal, with a key it cannot know
    for attempt in range(100):  # until the ROUTER let go of the dead connection's identity
        stranger = Client(hub.ctx, hub.server.address, hub.server.settings, SecuritySettings(),
                          link.identity)  # fmt: skip
        stranger.sealer = forged if attempt % 2 else None
        stranger.send(m.WorkRequest(instance="sc-1", credits=100))
        time.sleep(0.1)
        stranger.close()
        if "bad_seal" in hub.refused:
            break
    assert hub.refused and set(hub.refused) == {"bad_seal"}
    assert "sc-1" not in hub.registry.peers and ("sc-1", "bad_seal") in hub.gone
    link._hb_stop.set()


def test_a_beat_with_a_stale_key_changes_nothing_and_is_told_to_say_hello(
    hub: SealedHub,
) -> None:
    link = join(hub, "sc-2")
    try:
        link._hb_stop.set()  # its own beat socket goes: this one takes its identity
        assert link._hb is not None
        link._hb.join()
        for _ in range(50):  # until the ROUTER let go of the closed beat socket's identity
            beat = Client(hub.ctx, hub.server.address, hub.server.settings, SecuritySettings(),
                          link.identity + ".hb")  # fmt: skip
            beat.sealer = Sealer(b"k" * 32, 1)  # as if sealed with the key of a Hello before
            beat.send(m.Heartbeat(instance="sc-2"))
            reply = beat.recv(300)
            beat.close()
            if hub.server.rejected["beat_bad_seal"]:
                break
        assert hub.server.rejected["beat_bad_seal"] >= 1
        assert "sc-2" in hub.registry.peers and hub.refused == []
        assert isinstance(reply, m.Error) and reply.code == UNREGISTERED  # say Hello again
    finally:
        link.close("done")


def test_status_needs_the_status_key(hub: SealedHub) -> None:
    assert hub.sessions.auth is not None
    challenge = hub.sessions.auth.challenge
    assert not hub.sessions.may_read_status(b"x", m.StatusRequest())
    assert hub.refused == ["bad_status_request"]
    assert hub.sessions.may_read_status(b"x", sign_status(status_key(SECRET), challenge))
    forged = sign_status(status_key(b"b" * 64), challenge)
    assert not hub.sessions.may_read_status(b"x", forged)
    replayed = sign_status(status_key(SECRET), challenge)
    assert hub.sessions.may_read_status(b"x", replayed)
    assert not hub.sessions.may_read_status(b"x", replayed)


def test_a_status_request_signed_for_another_challenge_is_challenged(hub: SealedHub) -> None:
    before = sign_status(status_key(SECRET), "0" * 32)  # as signed for the hub before a restart
    assert not hub.sessions.may_read_status(b"x", before)
    assert hub.refused == [] and hub.sessions.challenged == 1
