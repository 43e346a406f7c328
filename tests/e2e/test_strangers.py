"""Strangers and a compromised generator on live `up` runs (no CURVE): without the run's
secret nothing they say is taken, not even under the identity of a peer that just died or
recorded before the hub restarted, and not one byte of the weights is theirs; with the
secret, a generator still cannot get a lie trained (impossible numbers, episodes of its own
making, rewards of its own). Each refusal is an error event, what the liar held is
re-dispatched, and the run, stopped as a user stops it, trained none of it.

Three runs: the default arithmetic task (most attacks), one with `hub.payloads = "direct"`
(unsigned Hellos naming a live generator), one playing `guess` episodes (rewards a scorer
recomputes). About 4 minutes in all on a quiet 2-core machine."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
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

from .conftest import (
    Run,
    assert_accounting,
    hub_events,
    metrics,
    pid_of,
    status,
    trainer_consumed,
    weights_address,
)
from .trust_peers import (
    EXPECTED,
    HUB_ATTACKS,
    Rogue,
    ask_raw,
    forged_turn,
    lying_rewards,
    nan_logprobs,
    record_member,
    replay,
)

# more steps than the module can see: the run stays live while every stranger asks and the
# rogue generator plays its leases (120 steps finished before the rogue got a lease in a CI
# run), and the last test stops it as a user would
STEPS = 100_000
PATIENT = ["--set", "transport.heartbeat_timeout_s=20.0"]
"""A peer is lost after 20 s of silence, not 3: on a loaded machine the honest services (and
the test's own peers) may not run for seconds, and a loss re-dispatches what they held."""
FAKE_REWARD = 100.0  # what the stranger scores with: one such group lifts a step's mean past 25


def _trainer_hello() -> m.Hello:
    """The attack that failed `up` at step 16: a rank-0 trainer with dead endpoints."""
    dead = m.Endpoints(weights="tcp://127.0.0.1:1", announce="tcp://127.0.0.1:2")
    return m.Hello(service="trainer", instance="trainer-x", host="h", pid=1, capacity=1,
                   rank=0, endpoints=dead)  # fmt: skip


def _hub(run: Run) -> str:
    assert run.proc.poll() is None, "the run ended before this stranger asked"
    return (run.run_dir / "hub.addr").read_text().strip()


def trained(run: Run, steps: int = 1) -> Iterator[Run]:
    """A module fixture's `run`, once it trained `steps` steps; killed after the module."""
    try:
        run.wait_steps(steps)
        yield run
    finally:
        run.kill()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    yield from trained(Run(tmp_path_factory.mktemp("strangers") / "run", STEPS, *PATIENT))


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
def test_nan_log_probs_are_refused_and_their_sender_quarantined(live: Run) -> None:
    rogue = Rogue(live.run_dir, [("nan_logprobs", nan_logprobs)], instance="nan-gen")
    try:
        rogue.join()
        rogue.play(rollouts=3)
        assert [err.code for _, err in rogue.replies[:3]] == ["bad_rollout"] * 3, rogue.replies
        later = rogue.offered(5.0)  # quarantined: no more work
    finally:
        rogue.close()
    assert not any(isinstance(msg, m.PromptBatch) for msg in later), later
    events = hub_events(live.run_dir, "generator.quarantined")
    quarantined = [e for e in events if e["instance"] == "nan-gen"]
    assert len(quarantined) == 1 and quarantined[0]["bad_rollouts"] == 3


@pytest.mark.slow
def test_a_stranger_gets_no_byte_of_the_weights(live: Run) -> None:
    address = weights_address(live.run_dir)
    forged = m.WeightsRequest(version=-1, auth="v2:1:00:" + "0" * 64)
    replies = ask_raw(address, [m.WeightsRequest(version=-1), forged])
    assert all(isinstance(r, m.Error) and r.code == "unauthorized" for r in replies), replies
    refused = []
    for path in (live.run_dir / "logs").glob("trainer-*.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        refused += [e for e in rows if e.get("event") == "weights.refused_fetch"]
    assert refused and refused[0]["level"] == "error"


@pytest.mark.slow
def test_the_security_check_finds_every_attack_held(live: Run) -> None:
    """`grpo-stream security-check RUN_DIR` against the live run: every attack HELD (the
    dashboard's too: `up` serves one), none BROKEN, exit 0."""
    argv = [sys.executable, "-m", "grpo_stream.cli.main", "security-check", str(live.run_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    held = [line.split()[1].rstrip(":") for line in lines if line.startswith("HELD")]
    assert {
        "hello-without-secret",
        "weights-without-proof",
        "hello-recorded-before-a-restart",
        "episode-fields",
        "nan-logprobs",
        "hellos-naming-a-generator",
    } <= set(held), lines
    assert not any(line.startswith("BROKEN") for line in lines)


@pytest.mark.slow
def test_a_session_recorded_before_a_hub_restart_is_refused_after_it(live: Run) -> None:
    """The attack that got a stranger welcomed as a scorer after the hub restarted: it
    replayed a recorded Hello and its sealed messages; now the Hello answers the old hub's
    challenge and gets the new one, and nothing sealed under the old session counts."""
    recorded = record_member(_hub(live), load_secret(live.run_dir / "secret"))
    identity = f"rec-scorer.{os.getpid()}"  # as the stranger read it off the wire
    resumed = len(hub_events(live.run_dir, "hub.resumed"))
    os.kill(int(status(live.run_dir)["counters"]["hub_pid"]), signal.SIGKILL)
    deadline = time.monotonic() + 120
    while len(hub_events(live.run_dir, "hub.resumed")) == resumed:
        assert time.monotonic() < deadline, "the hub was not restarted"
        time.sleep(0.5)
    hello, *sealed = replay(_hub(live), recorded, identity)
    assert isinstance(hello, m.Challenge), hello
    assert all(isinstance(r, m.Error) and r.code == "unregistered" for r in sealed), sealed
    assert "rec-scorer" not in {s["instance"] for s in status(live.run_dir)["services"]}
    live.wait_steps(len(metrics(live.run_dir)) + 1)  # the run goes on


@pytest.mark.slow
def test_the_run_stops_cleanly_and_none_of_it_was_trained(live: Run) -> None:
    assert live.proc.poll() is None, "the run ended before the strangers were done"
    live.proc.terminate()  # SIGTERM, as a user stops it: resumable, exit 130
    assert live.finish() == 130, Path(live.log.name).read_text()[-3000:]
    outcome = json.loads((live.run_dir / "outcome.json").read_text())
    assert outcome["ended"] == "interrupted", outcome
    refused = hub_events(live.run_dir, "hub.refused")
    codes = {e["code"] for e in refused}
    trust = {"bad_hello", "bad_seal", "bad_status_request", "bad_content", "bad_lease"}
    assert trust | {"bad_rollout"} <= codes
    assert all(e["level"] == "error" for e in refused if e["code"] in TRUST)
    assert max(r["reward_mean"] for r in metrics(live.run_dir)) < 10.0  # no FAKE_REWARD
    joined = [e["joined"] for e in hub_events(live.run_dir, "peer.joined")
              if e["instance"] == "scorer-0"]  # fmt: skip
    assert max(joined) >= 2  # the real scorer came back under a new identity
    assert_accounting(live.run_dir, len(metrics(live.run_dir)))


@pytest.fixture(scope="module")
def live_direct(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    direct = ["--set", 'hub.payloads="direct"']
    yield from trained(Run(tmp_path_factory.mktemp("direct") / "run", STEPS, *PATIENT, *direct), 2)


@pytest.mark.slow
def test_unsigned_hellos_naming_a_live_generator_cost_it_nothing(live_direct: Run) -> None:
    """The attack that made a direct-payloads hub drop a live generator's payloads 39 times
    (582 groups generated again): Hellos naming it as restarted, without the secret."""
    joined = len(hub_events(live_direct.run_dir, "peer.joined"))
    pid = pid_of(live_direct.run_dir, "generator-0")
    hellos: list[m.Message] = []
    for k in range(40):
        hello = m.Hello("generator", "generator-0", "h", pid=pid + 1 + k, capacity=4)
        hello.auth = "" if k % 2 else "v2:1:00:" + "0" * 32 + ":" + "0" * 64
        hellos.append(hello)
    replies = ask_raw(_hub(live_direct), hellos, wait_ms=1000)
    assert all(isinstance(r, m.Error | m.Challenge) for r in replies), replies
    time.sleep(1.0)
    assert hub_events(live_direct.run_dir, "payloads.holder_lost") == []
    assert len(hub_events(live_direct.run_dir, "peer.joined")) == joined
    assert pid_of(live_direct.run_dir, "generator-0") == pid


@pytest.fixture(scope="module")
def live_episodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    episodes = ("--task", "guess")
    yield from trained(Run(tmp_path_factory.mktemp("episodes") / "run", STEPS, *PATIENT, *episodes))


@pytest.mark.slow
def test_episode_rewards_are_a_scorers_not_the_generators(live_episodes: Run) -> None:
    """Honest guess episodes claiming a reward of 100, and episodes whose environment turns
    were forged: the first are trained with what the environment gives (at most 1.4), the
    second never (an error event names their generator)."""
    attacks = [("lying_rewards", lying_rewards), ("forged_turn", forged_turn)]
    rogue = Rogue(live_episodes.run_dir, attacks, instance="episode-gen")
    try:
        rogue.join()
        rogue.play(rollouts=4, replies=False)
    finally:
        rogue.close()
    assert rogue.replies == [] and len(rogue.sent) == 4  # nothing refused on arrival
    deadline = time.monotonic() + 120
    while len(hub_events(live_episodes.run_dir, "episode.refused")) < 2:
        assert time.monotonic() < deadline, "the forged episodes were not refused"
        time.sleep(0.5)
    refused = hub_events(live_episodes.run_dir, "episode.refused")
    assert {e["generator"] for e in refused} == {"episode-gen"}
    assert all(e["level"] == "error" for e in refused)
    steps = len(metrics(live_episodes.run_dir))
    live_episodes.wait_steps(steps + 4)
    trained = trainer_consumed(live_episodes.run_dir)
    assert trained and max(r["reward_mean"] for r in metrics(live_episodes.run_dir)) <= 1.4
