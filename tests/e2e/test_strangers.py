"""Strangers and a compromised generator on a live `up` run (no CURVE): without the run's
secret nothing they say is taken, not even under the identity of a peer that just died; with
the secret, a generator still cannot get a lie trained. Each refusal is an error event, what
the liar held is re-dispatched, and the run, stopped as a user stops it, trained none of it."""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from grpo_stream.hub.auth import load_secret, sign
from grpo_stream.hub.guard import TRUST
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import decode, encode

from .conftest import Run, assert_accounting, hub_events, metrics, pid_of, status
from .trust_peers import EXPECTED, HUB_ATTACKS, Rogue, ask_raw

# more steps than the module can see: the run stays live while every stranger asks and the
# rogue generator plays its leases (120 steps finished before the rogue got a lease in a CI
# run), and the last test stops it as a user would
STEPS = 100_000
FAKE_REWARD = 100.0  # what the stranger scores with: one such group lifts a step's mean past 25


def _trainer_hello() -> m.Hello:
    """The attack that failed `up` at step 16: a rank-0 trainer with dead endpoints."""
    dead = m.Endpoints(weights="tcp://127.0.0.1:1", announce="tcp://127.0.0.1:2")
    return m.Hello(service="trainer", instance="trainer-x", host="h", pid=1, capacity=1,
                   rank=0, endpoints=dead)  # fmt: skip


def _hub(run: Run) -> str:
    assert run.proc.poll() is None, "the run ended before this stranger asked"
    return (run.run_dir / "hub.addr").read_text().strip()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    run = Run(tmp_path_factory.mktemp("strangers") / "run", STEPS)
    try:
        run.wait_steps(1)
        yield run
    finally:
        run.kill()


@pytest.mark.slow
def test_the_runs_secret_and_status_token_are_private(live: Run) -> None:
    for name in ("secret", "status.token"):
        assert stat.S_IMODE((live.run_dir / name).stat().st_mode) == 0o600


@pytest.mark.slow
def test_a_stranger_without_the_secret_cannot_say_hello_as_the_trainer(live: Run) -> None:
    forged = _trainer_hello()
    forged.auth = "v1:1:00:" + "0" * 64  # well-formed, not made with the secret
    replies = ask_raw(_hub(live), [_trainer_hello(), forged])
    assert all(isinstance(r, m.Error) and r.code == "bad_hello" for r in replies), replies


@pytest.mark.slow
def test_status_without_the_secret_or_its_token_is_refused(live: Run) -> None:
    (reply,) = ask_raw(_hub(live), [m.StatusRequest()])
    assert isinstance(reply, m.Error) and reply.code == "bad_status_request", reply
    assert "hub_pid" not in json.dumps(reply.message)
    assert any(s["instance"] == "trainer-0" for s in status(live.run_dir)["services"])  # token


@pytest.mark.slow
def test_a_strangers_messages_under_a_guessed_name_are_refused_unregistered(live: Run) -> None:
    huge = m.BatchRequest(step=10**6, trainer_version=10**6)  # froze the run before
    replies = ask_raw(_hub(live), [huge, m.WorkRequest(instance="scorer-0", credits=9)],
                      identity="scorer-0")  # the instance's name is not its identity  # fmt: skip
    assert all(isinstance(r, m.Error) and r.code == "unregistered" for r in replies), replies


@pytest.mark.slow
def test_a_peer_with_the_secret_but_no_session_key_gets_nothing(live: Run) -> None:
    secret = load_secret(live.run_dir / "secret")
    hello = m.Hello(service="fuzzer", instance="fuzz-peer", host="h", pid=1, capacity=0)
    (challenge,) = ask_raw(_hub(live), [sign(hello, secret, "")])
    assert isinstance(challenge, m.Challenge)
    signed = sign(hello, secret, challenge.challenge)
    welcome, got = ask_raw(_hub(live), [signed, m.BatchRequest(step=0, trainer_version=0)])
    assert isinstance(welcome, m.Welcome)
    assert isinstance(got, m.Error) and got.code == "bad_seal", got  # not sealed


def _scorer_identity(run: Run) -> str:
    joined = [e for e in hub_events(run.run_dir, "peer.joined") if e["instance"] == "scorer-0"]
    return str(joined[-1]["identity"])


@pytest.mark.slow
def test_a_stranger_under_a_killed_scorers_identity_cannot_score(live: Run) -> None:
    """The attack that trained 1,764 groups scored by a stranger: scorer-0 is SIGKILLed, a
    stranger connects 0.1 s later under its identity (read off the wire: here, the log)
    while the hub still has it registered, asks for work and scores what it gets."""
    identity = _scorer_identity(live)
    os.kill(pid_of(live.run_dir, "scorer-0"), signal.SIGKILL)
    time.sleep(0.1)
    answers: list[m.Error] = []
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    deadline = time.monotonic() + 20
    try:
        while not answers and time.monotonic() < deadline:  # until its connection is taken
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IDENTITY, identity.encode())
            sock.connect(_hub(live))
            sock.send_multipart([bytes(f) for f in encode(m.WorkRequest(instance="scorer-0",
                                                                        credits=50))])  # fmt: skip
            end = time.monotonic() + 1.0
            while time.monotonic() < end and sock.poll(100):
                msg = decode(sock.recv_multipart())
                if isinstance(msg, m.ScoreRequest):  # sent to the dead scorer's identity
                    g = len(msg.completions)
                    fake = np.full(g, FAKE_REWARD, np.float32)
                    scored = m.Scored(lease_id=msg.lease_id, group_id=msg.group_id,
                                      rewards=fake, component_names=["r"],
                                      components=fake.reshape(1, g), errors=[""] * g)  # fmt: skip
                    sock.send_multipart([bytes(f) for f in encode(scored)])
                elif isinstance(msg, m.Error):
                    answers.append(msg)
            sock.close()
    finally:
        ctx.term()
    assert answers and answers[0].code == "bad_seal", answers
    assert all(a.code in ("bad_seal", "unregistered") for a in answers)
    dropped = [e for e in hub_events(live.run_dir, "peer.dropped") if e["instance"] == "scorer-0"]
    assert dropped and dropped[0]["level"] == "error"


@pytest.mark.slow
def test_a_generator_with_the_secret_gets_none_of_its_lies_trained(live: Run) -> None:
    """Texts that are not its token ids, an id out of the vocabulary, another prompt's ids,
    a lease it was not given, its own reference answer: every Rollout is refused (an Error
    answers each: none was taken)."""
    rogue = Rogue(live.run_dir, HUB_ATTACKS)
    try:
        rogue.join()
        rogue.play(rollouts=2 * len(HUB_ATTACKS))
    finally:
        rogue.close()
    assert len(rogue.replies) == len(rogue.sent) >= 2 * len(HUB_ATTACKS), rogue.replies
    assert {(name, err.code) for name, err in rogue.replies} == set(EXPECTED.items())


@pytest.mark.slow
def test_the_run_stops_cleanly_and_none_of_it_was_trained(live: Run) -> None:
    assert live.proc.poll() is None, "the run ended before the strangers were done"
    live.proc.terminate()  # SIGTERM, as a user stops it: resumable, exit 130
    assert live.finish() == 130, Path(live.log.name).read_text()[-3000:]
    outcome = json.loads((live.run_dir / "outcome.json").read_text())
    assert outcome["ended"] == "interrupted", outcome
    refused = hub_events(live.run_dir, "hub.refused")
    codes = {e["code"] for e in refused}
    assert {"bad_hello", "bad_seal", "bad_status_request", "bad_content", "bad_lease"} <= codes
    assert all(e["level"] == "error" for e in refused if e["code"] in TRUST)
    assert max(r["reward_mean"] for r in metrics(live.run_dir)) < 10.0  # no FAKE_REWARD
    joined = [e["joined"] for e in hub_events(live.run_dir, "peer.joined")
              if e["instance"] == "scorer-0"]  # fmt: skip
    assert max(joined) >= 2  # the real scorer came back under a new identity
    assert_accounting(live.run_dir, len(metrics(live.run_dir)))
