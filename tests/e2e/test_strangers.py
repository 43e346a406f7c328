"""Strangers on the hub's port of a live `up` run (no CURVE): without the run's secret
nothing they say Hello with is taken, and a peer that has the secret still cannot ask for
what only the trainer may. The run completes as if they were not there."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from grpo_stream.hub.auth import load_secret, sign
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import decode, encode

from .conftest import Run, hub_events

# long enough that the run is still live while every stranger asks (up to 5 s each): 40 steps
# could finish in ~16 s on a quiet machine and race the last strangers (one run in 4 failed)
STEPS = 120


def _ask(run: Run, *msgs: m.Message, identity: str = "") -> list[m.Message | None]:
    """Send each message on one stranger connection; the hub's reply to each (None: none)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity.encode())
    sock.connect((run.run_dir / "hub.addr").read_text().strip())
    replies: list[m.Message | None] = []
    assert run.proc.poll() is None, "the run ended before this stranger asked: raise STEPS"
    try:
        for msg in msgs:
            sock.send_multipart([bytes(f) for f in encode(msg)])
            replies.append(decode(sock.recv_multipart()) if sock.poll(5000) else None)
    finally:
        sock.close()
        ctx.term()
    return replies


def _trainer_hello() -> m.Hello:
    """The attack that failed `up` at step 16: a rank-0 trainer with dead endpoints."""
    dead = {"weights": "tcp://127.0.0.1:1", "announce": "tcp://127.0.0.1:2"}
    return m.Hello(service="trainer", instance="trainer-x", host="h", pid=1, capacity=1,
                   rank=0, endpoints=dead)  # fmt: skip


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    run = Run(tmp_path_factory.mktemp("strangers") / "run", STEPS)
    try:
        run.wait_steps(1)
        yield run
    finally:
        run.kill()


@pytest.mark.slow
def test_the_runs_secret_is_private(live: Run) -> None:
    assert stat.S_IMODE((live.run_dir / "secret").stat().st_mode) == 0o600


@pytest.mark.slow
def test_a_stranger_without_the_secret_cannot_say_hello_as_the_trainer(live: Run) -> None:
    forged = _trainer_hello()
    forged.auth = "v1:1:00:" + "0" * 64  # well-formed, not made with the secret
    replies = _ask(live, _trainer_hello(), forged)
    assert [type(r) for r in replies] == [m.Error, m.Error]
    assert all(isinstance(r, m.Error) and r.code == "bad_hello" for r in replies)


@pytest.mark.slow
def test_a_strangers_batch_request_and_short_scored_are_refused_unregistered(live: Run) -> None:
    huge = m.BatchRequest(step=10**6, trainer_version=10**6)  # froze the run before
    short = m.Scored(lease_id=1, group_id=0, rewards=np.zeros(3, np.float32),
                     component_names=["r"], components=np.zeros((1, 3), np.float32),
                     errors=[])  # fmt: skip  # 3 rewards for G=4: crashed the hub before
    replies = _ask(live, huge, short)
    assert all(isinstance(r, m.Error) and r.code == "unregistered" for r in replies), replies


@pytest.mark.slow
def test_a_stranger_with_the_trainers_identity_gets_nothing(live: Run) -> None:
    # the hub's ROUTER refuses a second connection with a live identity (no handover)
    replies = _ask(live, m.BatchRequest(step=0, trainer_version=0), identity="trainer-0")
    assert replies == [None]


@pytest.mark.slow
def test_a_peer_with_the_secret_cannot_ask_for_a_trainers_batch(live: Run) -> None:
    secret = load_secret(live.run_dir / "secret")
    hello = sign(m.Hello(service="fuzzer", instance="fuzz-peer", host="h", pid=1, capacity=0),
                 secret)  # fmt: skip
    welcome, got = _ask(live, hello, m.BatchRequest(step=0, trainer_version=0))
    assert isinstance(welcome, m.Welcome)
    assert not isinstance(got, m.TrainBatch), "the hub sent a trainer's batch to a stranger"


@pytest.mark.slow
def test_the_run_completes_and_the_hub_logged_each_refusal(live: Run) -> None:
    assert live.finish() == 0, Path(live.log.name).read_text()[-3000:]
    codes = [e["code"] for e in hub_events(live.run_dir, "hub.refused")]
    assert "bad_hello" in codes and "wrong_role" in codes
