"""`grpo-stream security-check RUN_DIR`: the attacks that broke live runs (issue #49) tried
against a user's own deployment, each reported HELD or BROKEN (SKIPPED where it does not
apply: no trainer endpoints yet, no live generator, no dashboard, no secret).

As a stranger (no secret, no key): a Hello as the trainer; a status request; a weights
request to the trainer's server; Hellos naming a live generator as restarted; a heartbeat
naming it. As a member (with RUN_DIR/secret, the way a compromised generator holds it): a
Hello signed for another hub's challenge (what a replay recorded before a hub restart is); the
same Hello twice; a rollout carrying episode fields the run does not play (or none on an
episode run); a rollout with NaN behaviour log-probs. Over HTTP: the dashboard without its
token.

What it costs the run: a few refused messages (error events in the hub's log, which is the
point), one generator lease answered with two refused rollouts (its prompts are generated
again), and, on a deployment where an attack is BROKEN, what that attack does (one group
trained with its sender's rewards, or NaN log-probs reaching the trainer). The member
generator gets a fresh instance name, so its two refusals never add up to a quarantine.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from grpo_stream.config import ConfigError, RunConfig, load_config
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.hub.auth import AuthError, load_secret, session_key, sign, status_credential
from grpo_stream.models.loading import load_tokenizer
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import decode, encode
from grpo_stream.session.status import HubStatus, StatusUnavailable, ask_status
from grpo_stream.transport.errors import TransportError
from grpo_stream.transport.seal import MAIN, Sealer
from grpo_stream.transport.sockets import Client, close_context, handshake, make_context

WAIT_MS = 3000
"""How long a probe waits for each answer."""
LEASE_WAIT_S = 60.0
"""How long the member generator waits for a lease."""
BEAT_S = 0.5
"""How often it beats meanwhile (a peer silent past the run's deadline is declared lost)."""


@dataclass(frozen=True)
class Verdict:
    """One attack's outcome: held (True), broken (False) or skipped (None), and why."""

    attack: str
    held: bool | None
    detail: str

    def line(self) -> str:
        word = "SKIPPED" if self.held is None else "HELD" if self.held else "BROKEN"
        return f"{word:<8}{self.attack}: {self.detail}"


@dataclass
class Target:
    """A live deployment as its run directory describes it."""

    run_dir: Path
    hub: str
    cfg: RunConfig | None
    secret: bytes | None
    status_key: bytes | None

    @classmethod
    def of(cls, run_dir: Path) -> Target:
        """From RUN_DIR; ValueError with one line when it holds no live hub's address."""
        addr = run_dir / "hub.addr"
        if not addr.exists():
            raise ValueError(f"{run_dir} has no hub.addr: is a run live there?")
        cfg: RunConfig | None = None
        if (run_dir / "config.toml").exists():
            try:
                cfg = load_config(run_dir / "config.toml")
            except ConfigError as exc:
                raise ValueError(f"{run_dir}/config.toml: {exc}") from None
        try:
            secret = load_secret(run_dir / "secret") if (run_dir / "secret").exists() else None
            key = status_credential(run_dir=run_dir)
        except AuthError as exc:
            raise ValueError(str(exc)) from None
        return cls(run_dir, addr.read_text().strip(), cfg, secret, key)

    def security(self, role: str = "client") -> SecuritySettings:
        """A member's sockets: the run's CURVE keys for `role`, when it uses CURVE."""
        if self.cfg is None or not self.cfg.security.curve:
            return SecuritySettings()
        return SecuritySettings(curve=True, keys_dir=self.cfg.security.keys_dir, client_name=role)

    def status(self) -> HubStatus | None:
        try:
            return ask_status(self.hub, self.security(), WAIT_MS / 1000, key=self.status_key)
        except StatusUnavailable:
            return None


def ask(
    address: str, msgs: Sequence[m.Message], identity: str = "", wait_ms: int = WAIT_MS
) -> list[m.Message | None]:
    """Each message from one plain stranger socket; the answer to each (None: none within
    `wait_ms`)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity.encode())
    sock.connect(address)
    answers: list[m.Message | None] = []
    try:
        for msg in msgs:
            sock.send_multipart([bytes(f) for f in encode(msg)])
            answers.append(decode(sock.recv_multipart()) if sock.poll(wait_ms) else None)
    finally:
        sock.close()
        ctx.term()
    return answers


def _held(attack: str, answers: list[m.Message | None], codes: tuple[str, ...]) -> Verdict:
    """HELD when every answer is a refusal with one of `codes` (or a Challenge, or none:
    CURVE turns a stranger away silently)."""
    bad = [a for a in answers if a is not None and not _refusal(a, codes)]
    if bad:
        return Verdict(attack, False, f"answered {type(bad[0]).__name__}: {_short(bad[0])}")
    said = sorted({a.code for a in answers if isinstance(a, m.Error)})
    return Verdict(attack, True, f"refused ({', '.join(said) or 'no answer'})")


def _refusal(answer: m.Message, codes: tuple[str, ...]) -> bool:
    return isinstance(answer, m.Challenge) or (isinstance(answer, m.Error) and answer.code in codes)


def _short(msg: m.Message) -> str:
    return repr(msg)[:120]


# ----- as a stranger ----------------------------------------------------------------------
def hello_without_secret(t: Target) -> Verdict:
    dead = m.Endpoints(weights="tcp://127.0.0.1:1", announce="tcp://127.0.0.1:2")
    hello = m.Hello("trainer", "check-trainer", "h", 1, 1, rank=0, endpoints=dead)
    return _held("hello-without-secret", ask(t.hub, [hello]), ("bad_hello",))


def status_without_token(t: Target) -> Verdict:
    answers = ask(t.hub, [m.StatusRequest()])
    if t.secret is None and isinstance(answers[0], m.Status):
        return Verdict("status-without-token", None, "the run has no secret (loopback demo)")
    return _held("status-without-token", answers, ("bad_status_request",))


def weights_without_proof(t: Target) -> Verdict:
    peers = Member(t, "check").join(leave=True).peers
    if peers is None:
        return Verdict("weights-without-proof", None, "no trainer endpoints yet")
    answers = ask(peers.weights, [m.WeightsRequest(version=-1)])
    return _held("weights-without-proof", answers, ("unauthorized",))


def _generator(t: Target) -> dict[str, Any] | None:
    status = t.status()
    gens = [] if status is None else [s for s in status.services if s["service"] == "generator"]
    return gens[0] if gens else None


def hellos_naming_a_generator(t: Target) -> Verdict:
    name = "hellos-naming-a-generator"
    before = _generator(t)
    if before is None:
        return Verdict(name, None, "no live generator (or no status token)")
    forged = "v2:1:00:" + "0" * 32 + ":" + "0" * 64
    pid = int(before["pid"])
    hellos = [m.Hello("generator", before["instance"], "h", pid + k + 1, 4) for k in range(10)]
    for k, hello in enumerate(hellos):
        hello.auth = forged if k % 2 else ""
    verdict = _held(name, ask(t.hub, hellos), ("bad_hello",))
    after = _generator(t)
    if verdict.held and (after is None or after.get("joined") != before.get("joined")):
        return Verdict(name, False, f"{before['instance']} was registered again")
    return verdict


def heartbeat_naming_a_peer(t: Target) -> Verdict:
    gen = _generator(t)
    if gen is None:
        return Verdict("heartbeat-naming-a-peer", None, "no live generator (or no status token)")
    answers = ask(t.hub, [m.Heartbeat(instance=gen["instance"])])
    if answers[0] is None:
        return Verdict("heartbeat-naming-a-peer", True, "no answer (CURVE)")
    return _held("heartbeat-naming-a-peer", answers, ("unregistered",))


def dashboard_without_token(t: Target) -> Verdict:
    url_file = t.run_dir / "dashboard.url"
    if not url_file.exists():
        return Verdict("dashboard-without-token", None, "no dashboard is served")
    base = url_file.read_text().strip().split("?", 1)[0]
    try:
        with urllib.request.urlopen(base + "api/state", timeout=WAIT_MS / 1000) as reply:
            return Verdict("dashboard-without-token", False, f"HTTP {reply.status}: the state")
    except urllib.error.HTTPError as exc:
        return Verdict("dashboard-without-token", exc.code in (401, 403), f"HTTP {exc.code}")
    except OSError as exc:
        return Verdict("dashboard-without-token", None, f"not reachable: {exc}")


# ----- as a member (with the run's secret) ------------------------------------------------
class Member:
    """A peer holding the run's secret (and its role's CURVE key, under CURVE)."""

    def __init__(self, t: Target, service: str) -> None:
        self.t = t
        self.service = service
        self.instance = f"security-check-{os.getpid()}-{service}-{time.monotonic_ns() % 10**6}"
        self.ctx = make_context()
        security = t.security(service)
        identity = f"{self.instance}.id"
        self.client = Client(self.ctx, t.hub, TransportSettings(), security, identity)
        self.sent: m.Hello | None = None

    def hello(self, challenge: str) -> m.Hello:
        """A Hello signed for `challenge`; what follows it is sealed with its session key."""
        hello = m.Hello(self.service, self.instance, socket.gethostname(), os.getpid(), 1)
        if self.t.secret is not None:
            sign(hello, self.t.secret, challenge)
            self.client.sealer = Sealer(session_key(self.t.secret, hello), MAIN)
        self.sent = hello
        return hello

    def join(self, leave: bool = False) -> m.Welcome:
        try:
            welcome = handshake(self.client, self.hello(""), WAIT_MS / 1000 * 10, self.hello)
        except TransportError:
            self.leave()
            raise
        if leave:
            self.leave()
        return welcome

    def answer(self, msg: m.Message) -> m.Message | None:
        """Send `msg` on this member's socket; the first answer within WAIT_MS."""
        self.client.send(msg)
        return self.client.recv(WAIT_MS)

    def leave(self) -> None:
        try:
            self.client.send(m.Shutdown(reason="done"))
        finally:
            self.client.close()
            close_context(self.ctx)


def hello_for_another_hub(t: Target) -> Verdict:
    """What a Hello recorded before a hub restart is: signed for a challenge this hub did not
    draw. Refused (challenged), it opens no session."""
    name = "hello-recorded-before-a-restart"
    if t.secret is None:
        return Verdict(name, None, "the run has no secret")
    member = Member(t, "scorer")
    try:
        got = member.answer(member.hello("0f" * 16))
    finally:
        member.leave()
    if isinstance(got, m.Welcome):
        return Verdict(name, False, "welcomed: a session recorded before a restart replays")
    return Verdict(name, True, f"answered {type(got).__name__}")


def hello_twice(t: Target) -> Verdict:
    """A member's accepted Hello sent again from another socket (a replay within the hub's
    life): refused, its nonce was seen."""
    if t.secret is None:
        return Verdict("hello-replayed", None, "the run has no secret")
    first, second = Member(t, "scorer"), Member(t, "scorer")
    try:
        first.join()
        accepted = first.sent
        got = None if accepted is None else second.answer(accepted)
    finally:
        first.leave()
        second.leave()
    return _held("hello-replayed", [got], ("bad_hello",))


def _rollout(tok: Any, batch: m.PromptBatch, i: int, instance: str) -> m.Rollout:
    """An honest-looking answer to prompt i of `batch`: each completion the token of "1"."""
    one = tok("1", add_special_tokens=False)["input_ids"][-1:]
    g = batch.group_size
    return m.Rollout(
        lease_id=batch.lease_id,
        group_id=int(batch.group_ids[i]),
        instance=instance,
        policy_version=batch.min_version,
        prompt_ids=np.array(tok(batch.prompts[i])["input_ids"], np.int32),
        completion_ids=np.array(one * g, np.int32),
        completion_offsets=np.arange(g + 1, dtype=np.int64) * len(one),
        logprobs=np.full(g * len(one), -0.5, np.float32),
        texts=[tok.decode(one, skip_special_tokens=True)] * g,
        truncated=[False] * g,
        gen_seconds=0.01,
        sampling=batch.sampling,
    )


def _episode_fields(ro: m.Rollout) -> m.Rollout:
    """Episode fields on a rollout: its own rewards (1.0 for the first completion)."""
    g, n = len(ro.texts), len(ro.completion_ids)
    rewards = np.zeros(g, np.float32)
    rewards[0] = 1.0
    ro.loss_mask, ro.episode_rewards, ro.turn_rewards = np.ones(n, np.uint8), rewards, rewards
    ro.turn_starts, ro.turn_offsets = np.zeros(g, np.int64), np.arange(g + 1, dtype=np.int64)
    return ro


def _leases(member: Member, prompts: int) -> list[tuple[m.PromptBatch, int]]:
    member.client.send(m.WorkRequest(instance=member.instance, credits=prompts))
    got: list[tuple[m.PromptBatch, int]] = []
    deadline = time.monotonic() + LEASE_WAIT_S
    next_beat = 0.0
    while len(got) < prompts and time.monotonic() < deadline:
        if time.monotonic() >= next_beat:  # alive, as a generator waiting for work is
            next_beat = time.monotonic() + BEAT_S
            member.client.send(m.Heartbeat(instance=member.instance))
        msg = member.client.recv(200)
        if isinstance(msg, m.PromptBatch):
            got += [(msg, i) for i in range(len(msg.group_ids))]
    return got[:prompts]


def impossible_rollouts(t: Target) -> list[Verdict]:
    """As a generator holding the secret: a rollout of the kind the run does not play, and
    one with NaN behaviour log-probs; each must be refused (bad_rollout)."""
    names = ("episode-fields", "nan-logprobs")
    if t.secret is None or t.cfg is None:
        return [Verdict(n, None, "the run has no secret or no config.toml") for n in names]
    tok = load_tokenizer(t.cfg.model.name_or_path)  # before joining: a silent peer is lost
    member = Member(t, "generator")
    try:
        member.join()
        leased = _leases(member, 2)
        if len(leased) < 2:
            return [Verdict(n, None, f"no lease within {LEASE_WAIT_S:g} s") for n in names]
        wrong = [_rollout(tok, b, i, member.instance) for b, i in leased]
        if not t.cfg.env.enabled:
            _episode_fields(wrong[0])  # an episode run: the plain rollout is the wrong kind
        wrong[1].logprobs = np.full(len(wrong[1].logprobs), np.nan, np.float32)
        return [_taken(n, member, ro) for n, ro in zip(names, wrong, strict=True)]
    finally:
        member.leave()


def _taken(name: str, member: Member, rollout: m.Rollout) -> Verdict:
    """HELD when the hub refuses `rollout` as bad_rollout; BROKEN when it takes it (no
    refusal within WAIT_MS); SKIPPED when refused for another reason (not reached)."""
    member.client.send(rollout)
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        msg = member.client.recv(200)
        if isinstance(msg, m.Error) and msg.in_reply_to == m.Rollout.KIND:
            held = True if msg.code == "bad_rollout" else None
            return Verdict(name, held, f"refused ({msg.code})")
    return Verdict(name, False, f"taken: no refusal within {WAIT_MS / 1000:g} s")


ATTACKS: list[Callable[[Target], Verdict | list[Verdict]]] = [
    hello_without_secret,
    status_without_token,
    weights_without_proof,
    hellos_naming_a_generator,
    heartbeat_naming_a_peer,
    hello_for_another_hub,
    hello_twice,
    impossible_rollouts,
    dashboard_without_token,
]


def speaks_our_protocol(t: Target) -> bool:
    """Whether the hub decodes this grpo-stream's messages (an older one answers every probe
    with `version`, which would read as a refusal)."""
    (answer,) = ask(t.hub, [m.StatusRequest()])
    return not (isinstance(answer, m.Error) and answer.code == "version")


def run_checks(t: Target, say: Callable[[str], None] = print) -> list[Verdict]:
    """Every attack in turn; each verdict said as it comes."""
    if not speaks_our_protocol(t):
        why = "the hub speaks another protocol version: check it with the grpo-stream it runs"
        skipped = Verdict("all", None, why)
        say(skipped.line())
        return [skipped]
    out: list[Verdict] = []
    for attack in ATTACKS:
        try:
            got = attack(t)
        except (TransportError, StatusUnavailable) as exc:
            got = Verdict(attack.__name__.replace("_", "-"), None, f"could not try: {exc}")
        for verdict in got if isinstance(got, list) else [got]:
            say(verdict.line())
            out.append(verdict)
    return out
