"""Nothing a stranger sends the hub is acted on: every message kind of the protocol, sent by
a process without the run's secret, leaves the hub's state as it was (the ledger, leases,
peers, shares, buffer, payload locations, quarantine, the trainer's endpoints, the batch
desk), on every path: payloads through the hub, direct payloads, distillation, episodes.
The members that built that state hold the secret and drive the real `Grouper` in process
(signed Hellos for the hub's challenge, sealed messages)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_stream.config import load_config
from grpo_stream.hub.auth import load_secret, session_key, sign, write_secret
from grpo_stream.hub.ledger_state import ledger_state
from grpo_stream.hub.payloads.store import rollout_meta
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import encode
from grpo_stream.protocols.digest import payload_digest
from grpo_stream.protocols.make_golden import examples
from grpo_stream.services.grouper import Grouper
from grpo_stream.transport.seal import MAIN, Sealer, parse
from grpo_stream.transport.sockets import close_context

G = 2
STORE = "tcp://127.0.0.1:7001"


@dataclass
class Member:
    """A service holding the run's secret: its Hello answers the hub's challenge and every
    message after it is sealed, as `Session` does over a socket."""

    hub: Grouper
    secret: bytes
    service: str
    instance: str
    pid: int = 100
    sealer: Sealer | None = None
    identity: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.identity = f"{self.instance}.{self.pid}".encode()

    def hello(self) -> None:
        auth = self.hub.sessions.auth
        assert auth is not None
        hello = m.Hello(self.service, self.instance, "h", self.pid, capacity=4)
        sign(hello, self.secret, auth.challenge)
        self.sealer = Sealer(session_key(self.secret, hello), MAIN)
        self.hub.server.last_seal = None
        self.hub._handle(self.identity, hello)

    def send(self, msg: m.Message) -> None:
        assert self.sealer is not None
        frames = [bytes(f) for f in encode(msg)]
        self.hub.server.last_seal = parse(self.sealer.seal(frames), frames)
        self.hub._handle(self.identity, msg)


def make_hub(tmp_path: Path, *sets: str) -> tuple[Grouper, bytes]:
    secret = write_secret(tmp_path / "secret")
    small = [f"generator.group_size={G}", "generator.prompts_per_request=2"]
    run = [f'run.run_dir="{tmp_path}"', f'security.secret_file="{secret}"']
    unchecked = ["hub.groups_per_step=2", "security.check_content=false"]  # synthetic ids
    cfg = load_config(None, [*run, *small, *unchecked, *sets])
    return Grouper(cfg), load_secret(secret)


class Sent:
    """What the hub sent, by identity (the server's send, recorded instead)."""

    def __init__(self, hub: Grouper) -> None:
        self.messages: list[tuple[bytes, m.Message]] = []
        hub.server.send = self._send  # type: ignore[method-assign]

    def _send(self, identity: bytes, msg: m.Message) -> bool:
        self.messages.append((identity, msg))
        return True

    def to(self, identity: bytes) -> list[m.Message]:
        return [msg for who, msg in self.messages if who == identity]


def rollout(batch: m.PromptBatch, i: int, instance: str) -> m.Rollout:
    """An honest-looking single-turn Rollout of prompt i of `batch` (3 tokens each)."""
    return m.Rollout(
        lease_id=batch.lease_id,
        group_id=int(batch.group_ids[i]),
        instance=instance,
        policy_version=batch.min_version,
        prompt_ids=np.array([1, 2], np.int32),
        completion_ids=np.arange(5, 5 + 3 * G, dtype=np.int32),
        completion_offsets=np.arange(0, 3 * G + 1, 3, dtype=np.int64),
        logprobs=np.full(3 * G, -0.5, np.float32),
        texts=["3"] * G,
        truncated=[False] * G,
        gen_seconds=0.1,
        sampling=batch.sampling,
    )


def episodes(batch: m.PromptBatch, i: int, instance: str) -> m.Rollout:
    """Two episodes of prompt i: [a0 a1 | e e | a2] and [b0 | e | b1], two turns each."""
    done = rollout(batch, i, instance)
    done.completion_ids = np.array([10, 11, 20, 21, 12, 30, 22, 31], np.int32)
    done.completion_offsets = np.array([0, 5, 8], np.int64)
    done.logprobs = np.array([-0.1, -0.2, 0, 0, -0.3, -0.4, 0, -0.5], np.float32)
    done.loss_mask = np.array([1, 1, 0, 0, 1, 1, 0, 1], np.uint8)
    done.episode_rewards = np.array([1.1, 0.1], np.float32)
    done.turn_rewards = np.array([0.1, 1.0, 0.1, 0.0], np.float32)
    done.turn_starts = np.array([0, 4, 0, 2], np.int64)
    done.turn_offsets = np.array([0, 2, 4], np.int64)
    return done


def result(hub: Grouper, batch: m.PromptBatch, i: int) -> m.Rollout:
    """Prompt i's Rollout as the run plays it (an episode run: episodes)."""
    make = episodes if hub.cfg.env.enabled else rollout
    return make(batch, i, "generator-0")


@dataclass
class Run:
    hub: Grouper
    secret: bytes
    sent: Sent
    generator: Member
    batch: m.PromptBatch


def live_run(hub: Grouper, secret: bytes) -> Run:
    """A trainer asking for step 0, a scorer and a generator with credits; the generator
    answered one of its two prompts (a group waits for its score)."""
    sent = Sent(hub)
    members = {s: Member(hub, secret, s, f"{s}-0") for s in ("trainer", "scorer", "generator")}
    for member in members.values():
        member.hello()
    gen = members["generator"]
    gen.send(m.WorkRequest(instance="generator-0", credits=2))
    members["scorer"].send(m.WorkRequest(instance="scorer-0", credits=0))
    members["trainer"].send(m.BatchRequest(step=0, trainer_version=0))
    hub._dispatch(0.0)
    (batch,) = [b for b in sent.to(gen.identity) if isinstance(b, m.PromptBatch)]
    done = result(hub, batch, 0)
    if hub.direct is None:
        gen.send(done)
    else:
        gen.send(rollout_meta(done, STORE, payload_digest(done)))
    return Run(hub, secret, sent, gen, batch)


def state(hub: Grouper) -> dict[str, Any]:
    """Everything a message could change at the hub."""
    peers = {i: (p.identity, p.pid, p.credits, p.service) for i, p in hub.registry.peers.items()}
    seen = {
        "ledger": ledger_state(hub.ledger),
        "leases": hub.ledger.leases.held_by(),
        "peers": peers,
        "features": dict(hub.shares.features),
        "measured": dict(hub.shares.measured),
        "buffer": [g.group_id for g in hub.buffer.groups()],
        "rollouts": sorted(hub.rollouts),
        "where": None if hub.direct is None else dict(hub.direct.where),
        "quarantined": set(hub.trust.quarantined),
        "bad": dict(hub.trust.bad_rollouts),
        "endpoints": hub.sessions.trainer_endpoints,
        "desk": hub.desk.state(),
        "teaching": None if hub.teaching is None else sorted(hub.teaching.groups),
    }
    return copy.deepcopy(seen)


def strangers_messages(run: Run) -> list[m.Message]:
    """One of every kind on the wire, and the ones aimed at the live peers: a Hello naming
    the live generator as restarted (it dropped its payloads 39 times with direct
    payloads), its heartbeat, its result and its leaving, none signed or sealed."""
    as_generator = m.Hello("generator", "generator-0", "h", pid=999, capacity=4)
    forged = copy.copy(as_generator)
    forged.auth = "v2:1:00:" + "0" * 32 + ":" + "0" * 64
    stats = m.GeneratorStats(
        tokens_per_s=1e9, wait_s=0, version=0, batches=0, prompts_total=0, busy_s=0
    )
    return [
        *examples(),
        as_generator,
        forged,
        m.Heartbeat(instance="generator-0", hub_rtt_s=9.0, generator=stats),
        result(run.hub, run.batch, 1),
        m.Shutdown(reason="done"),
        m.WorkRequest(instance="generator-0", credits=100),
        m.BatchRequest(step=0, trainer_version=0),
    ]


@pytest.fixture(params=["hub", "direct", "teacher", "episodes"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Run]:
    sets = {
        "hub": [],
        "direct": ['hub.payloads="direct"'],
        "teacher": ['algo.distill.teacher="grpo-stream/tiny-arith"'],
        "episodes": ['task.name="guess"', 'env.name="guess"'],
    }[request.param]
    hub, secret = make_hub(tmp_path, *sets)
    try:
        yield live_run(hub, secret)
    finally:
        hub.server.close()
        close_context(hub.ctx)


def test_no_message_from_a_stranger_changes_the_hubs_state(run: Run) -> None:
    before = state(run.hub)
    assert before["peers"] and before["leases"]  # there is something to change
    for msg in strangers_messages(run):
        for identity in (b"stranger", b"generator-0"):  # its own name, a live instance's
            run.hub.server.last_seal = None
            run.hub._handle(identity, msg)
            assert state(run.hub) == before, f"{msg.KIND} from {identity!r} changed the hub"


def test_every_stranger_message_is_answered_with_a_refusal_or_nothing(run: Run) -> None:
    for msg in strangers_messages(run):
        run.hub.server.last_seal = None
        run.hub._handle(b"stranger", msg)
    answers = run.sent.to(b"stranger")
    assert answers and all(isinstance(a, m.Error | m.Challenge) for a in answers), answers


def test_a_generator_restarted_with_the_secret_has_its_payloads_generated_again(
    tmp_path: Path,
) -> None:
    hub, secret = make_hub(tmp_path, 'hub.payloads="direct"')
    try:
        run = live_run(hub, secret)
        (held,) = hub.direct.where if hub.direct is not None else {}
        Member(hub, secret, "generator", "generator-0", pid=100).hello()  # same process
        assert hub.ledger.stage[held] == "to_score"
        Member(hub, secret, "generator", "generator-0", pid=101).hello()  # a new process
        assert hub.ledger.stage[held] == "queued" and held in hub.ledger.retry
        assert run.generator.instance in hub.registry.peers
    finally:
        hub.server.close()
        close_context(hub.ctx)
