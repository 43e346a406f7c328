"""Heartbeat bookkeeping: pure logic with an explicit clock, then over real sockets."""

from __future__ import annotations

import time

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.protocols.messages import Heartbeat
from grpo_stream.transport.heartbeat import Heartbeats, HeartbeatSender
from grpo_stream.transport.sockets import Client, Context, Server


def test_peer_within_deadline_is_not_lost() -> None:
    beats: Heartbeats[str] = Heartbeats(timeout_s=1.0)
    beats.beat("a", now=10.0)
    assert beats.lost(now=11.0) == []
    assert "a" in beats


def test_silent_peer_is_lost_once_and_forgotten() -> None:
    beats: Heartbeats[str] = Heartbeats(timeout_s=1.0)
    beats.beat("a", now=10.0)
    beats.beat("b", now=10.5)
    assert beats.lost(now=11.2) == ["a"]
    assert beats.lost(now=11.3) == []
    assert "a" not in beats and "b" in beats


def test_lost_peers_come_oldest_first() -> None:
    beats: Heartbeats[str] = Heartbeats(timeout_s=1.0)
    beats.beat("late", now=5.0)
    beats.beat("early", now=1.0)
    assert beats.lost(now=100.0) == ["early", "late"]


def test_next_deadline_is_oldest_beat_plus_timeout() -> None:
    beats: Heartbeats[str] = Heartbeats(timeout_s=2.0)
    assert beats.next_deadline() is None
    beats.beat("a", now=3.0)
    beats.beat("b", now=1.0)
    assert beats.next_deadline() == 3.0


def test_sender_is_due_at_start_then_after_each_interval() -> None:
    sender = HeartbeatSender(interval_s=0.5, now=0.0)
    assert sender.due(0.0)
    sender.sent(0.0)
    assert not sender.due(0.4)
    assert sender.wait_ms(0.4) == 100
    assert sender.due(0.5)


def test_silent_peer_over_sockets_is_declared_lost(
    ctx: Context, settings: TransportSettings, plain: SecuritySettings
) -> None:
    server = Server(ctx, "tcp://127.0.0.1:0", settings, plain, "hub")
    alive = Client(ctx, server.address, settings, plain, "alive")
    silent = Client(ctx, server.address, settings, plain, "silent")
    silent.send(Heartbeat(instance="silent"))  # one beat, then nothing
    beats: Heartbeats[bytes] = Heartbeats(settings.heartbeat_timeout_s)
    sender = HeartbeatSender(settings.heartbeat_interval_s, time.monotonic())
    lost: list[bytes] = []
    deadline = time.monotonic() + 20
    while not lost and time.monotonic() < deadline:
        if sender.due(time.monotonic()):
            alive.send(Heartbeat(instance="alive"))
            sender.sent(time.monotonic())
        got = server.recv(min(20, sender.wait_ms(time.monotonic())))
        if got is not None:
            beats.beat(got[0], time.monotonic())
        lost = beats.lost(time.monotonic())
    assert lost == [b"silent"]
    assert b"alive" in beats
    alive.close()
    silent.close()
    server.close()
