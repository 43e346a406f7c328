"""The hub side of the session: Hello and Welcome, heartbeats and their deadline, credits,
leaving, and the binding of every message to the session its Hello opened. The grouper hands
every message to `HubSessions.handle` first; what comes back is work (Rollout, Scored,
BatchRequest, ...) from a registered peer, checked to be that peer's.

Invariants:
- nothing is acted on before its signature: a message from an identity the registry does not
  know changes nothing and is answered with Error(UNREGISTERED) (the service says Hello
  again: it was lost, or the hub restarted); a Hello or StatusRequest that does not answer
  this hub's challenge gets the challenge (`Challenge`) and changes nothing, so nothing
  signed for the hub before a restart is accepted after it;
- with the run's secret, a message after Hello counts only with the seal of its peer's
  session (`grpo_stream.transport.seal`: the key only the Hello's signer can compute, each
  message numbered once); under CURVE, only from the client key its Hello came with. A
  message that fails either is refused (code `bad_seal`, one error event) and its peer is
  dropped at once, what it held re-dispatched: whoever holds that connection now is not the
  peer that said Hello (a stranger who took its identity after it died cannot act as it);
- a heartbeat counts only from the instance's main socket or its heartbeat socket
  (`beat_identity`), sealed likewise: a stranger cannot keep a dead peer alive; a beat that
  is refused changes nothing and is answered with Error(UNREGISTERED) at once, so a peer the
  hub no longer knows under that session says Hello again instead of going silent;
- a StatusRequest is answered under CURVE from any allowed key (the role-less `client` key is
  the read-only credential there); without CURVE, with the run's secret, only when signed
  with the status key (the secret's, or a status.token's);
- what a lost, restarted or leaving peer held goes back to the ledger at once;
- when the rank-0 trainer says Hello with endpoints, every other peer gets a new Welcome;
- every Welcome carries the same config and digest, also after a restart on the same port
  (the config's `hub.bind` is the bound address).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import structlog

from grpo_stream.config import RunConfig
from grpo_stream.hub import guard
from grpo_stream.hub.auth import hello_auth, key_roles, session_key
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.registry import Peer, Registry
from grpo_stream.hub.shares import ShareBook
from grpo_stream.protocols import messages as m
from grpo_stream.session.identity import UNREGISTERED, beat_identity
from grpo_stream.transport.seal import BEATS, MAIN, Opener
from grpo_stream.transport.sockets import Server

log = structlog.get_logger()

Refuse = Callable[[bytes, str, str, str], None]
"""(identity, code, reason, kind): count, answer with Error and log a refused message."""


class RunFacts(Protocol):
    """What a Welcome tells besides the config: the run and the trainer's version."""

    run_id: str

    @property
    def policy_version(self) -> int: ...


class HubSessions:
    """Who is joined, and the session messages of each."""

    def __init__(
        self,
        cfg: RunConfig,
        server: Server,
        registry: Registry,
        ledger: Ledger,
        shares: ShareBook,
        facts: RunFacts,
        refuse: Refuse,
        secret: bytes | None = None,
    ) -> None:
        # The config as it runs, port 0 resolved to the bound one: a hub restarted on that
        # port (as `up` restarts it, `--set hub.bind=...`) welcomes with the same digest.
        self.cfg = cfg.model_copy(
            update={"hub": cfg.hub.model_copy(update={"bind": server.address})}
        )
        self.server = server
        self.registry = registry
        self.ledger = ledger
        self.shares = shares
        self.facts = facts
        self.refuse = refuse
        self.digest = self.cfg.digest()
        self._config = self.cfg.model_dump(mode="json")  # every Welcome carries it: dump once
        self.secret = secret
        self.auth = hello_auth(secret)  # None: Hellos are not signed, messages not sealed
        self.roles = key_roles(cfg.security)  # None: no CURVE, no key to check roles against
        self.trainer_endpoints: m.Endpoints | None = None  # what the rank-0 trainer announced
        self.trainer_done = False  # the trainer left with reason "done": the run is over
        self.challenged = 0  # signed requests answered with the challenge (not refusals)
        # told of each peer gone: (peer, why): "silent", "bad_seal", "restarted", or the
        # reason its Shutdown gave ("done" when the trainer finished the run)
        self.on_gone: list[Callable[[Peer, str], None]] = []

    def handle(self, identity: bytes, msg: m.Message) -> Peer | None:
        """Take the session's messages; return the registered sender of any other."""
        if isinstance(msg, m.Hello):
            self._on_hello(identity, msg)
            return None
        if isinstance(msg, m.Heartbeat):
            self._on_beat(identity, msg)
            return None
        peer = self.registry.by_identity(identity)
        if peer is None:
            self._unregistered(identity, msg.KIND)
            return None
        refused = self._not_its_session(peer, MAIN)
        if refused is not None:
            self.refuse(identity, "bad_seal", refused, msg.KIND)
            self._drop(peer, refused)
            return None
        self.registry.beat(peer.instance, time.monotonic())  # any message proves liveness
        if isinstance(msg, m.WorkRequest):
            peer.credits = max(0, peer.credits + msg.credits)
            return None
        if isinstance(msg, m.Shutdown):
            self._on_leave(peer, msg.reason)
            return None
        return peer

    def may_read_status(self, identity: bytes, msg: m.StatusRequest) -> bool:
        """Whether to answer `msg`; a request without the run's status key is refused, one
        signed for another challenge is answered with this hub's."""
        if self.auth is None or self.roles is not None:
            return True  # CURVE: an allowed key; neither CURVE nor a secret: loopback only
        if self.auth.stale(msg.auth):
            self._challenge(identity, msg.KIND)
            return False
        refused = self.auth.check_status(msg)
        if refused is not None:
            self.refuse(identity, "bad_status_request", refused, msg.KIND)
        return refused is None

    def welcome(self) -> m.Welcome:
        return m.Welcome(
            run_id=self.facts.run_id,
            config=self._config,
            config_digest=self.digest,
            peers=self.trainer_endpoints,
            policy_version=self.facts.policy_version,
        )

    def expire(self, now: float) -> list[Peer]:
        """Peers silent past the heartbeat deadline: removed, what they held released."""
        lost = self.registry.expire(now)
        for peer in lost:
            n = self.ledger.release_holder(peer.instance)
            log.warning(
                "peer.lost", instance=peer.instance, service=peer.service, host=peer.host,
                requeued=n,
            )  # fmt: skip
            self._gone(peer, "silent")
        return lost

    def _gone(self, peer: Peer, why: str) -> None:
        for hook in self.on_gone:
            hook(peer, why)

    def _not_its_session(self, peer: Peer, channel: int) -> str | None:
        """Why the message just received is not from `peer`'s session (None: it is)."""
        if self.roles is not None and self.server.last_user_id != peer.user_id:
            return f"{peer.instance}'s session is bound to another CURVE key"
        if peer.opener is None:
            return None
        seal = self.server.last_seal
        if seal is not None and seal.channel != channel:
            return f"a seal of channel {seal.channel} on channel {channel}"
        return peer.opener.open(seal)

    def _drop(self, peer: Peer, why: str) -> None:
        """Someone else holds `peer`'s connection now: forget the peer, release its work."""
        n = self.ledger.release_holder(peer.instance)
        self.registry.remove(peer.instance)
        log.error(
            "peer.dropped", instance=peer.instance, service=peer.service, reason=why, requeued=n
        )
        self._gone(peer, "bad_seal")

    def _challenge(self, identity: bytes, kind: str) -> None:
        """Answer a signed request that does not answer this hub's challenge (a service's
        first, or one signed before the hub restarted) with the challenge: changes nothing."""
        auth = self.auth
        if auth is None:
            return
        self.challenged += 1
        self.server.send(identity, m.Challenge(challenge=auth.challenge, in_reply_to=kind))

    def _unregistered(self, identity: bytes, kind: str) -> None:
        # a lost peer, or one from before a hub restart: tell it to say Hello again
        self.server.rejected[UNREGISTERED] += 1
        self.server.send(
            identity, m.Error(code=UNREGISTERED, message="send Hello first", in_reply_to=kind)
        )

    def _on_beat(self, identity: bytes, msg: m.Heartbeat) -> None:
        """Beats come from a side socket: matched by instance, from that peer's sockets only,
        sealed with its session's key. A beat that fails changes nothing (counted) and is
        answered with Error(UNREGISTERED): its sender says Hello again (a service ignores
        such answers for a moment after its Hello: one sealed with the key of the Hello
        before may arrive just after a new Hello)."""
        known = self.registry.peers.get(msg.instance)
        if known is None:
            self._unregistered(identity, msg.KIND)
            return
        beat = beat_identity(known.identity.decode()).encode()
        if identity not in (known.identity, beat):
            self.server.rejected["beat_spoofed"] += 1
            self._unregistered(identity, msg.KIND)
            return
        channel = MAIN if identity == known.identity else BEATS
        if self._not_its_session(known, channel) is not None:
            self.server.rejected["beat_bad_seal"] += 1
            self._unregistered(identity, msg.KIND)
            return
        self.registry.beat(msg.instance, time.monotonic(), msg)
        self.shares.report_latency(msg.instance, msg.hub_rtt_s)
        if msg.generator is not None:
            self.shares.report(msg.instance, msg.generator.tokens_per_s)

    def _on_hello(self, identity: bytes, hello: m.Hello) -> None:
        if self.auth is not None and self.auth.stale(hello.auth):
            self._challenge(identity, hello.KIND)  # a first Hello, or one from before a restart
            return
        refused = guard.check_hello(
            hello, self.registry, self.auth, self.roles, self.server.last_user_id
        )
        if refused is not None:
            self.refuse(identity, "bad_hello", refused, hello.KIND)
            return
        old = self.registry.peers.get(hello.instance)
        if old is not None:  # a restarted instance: what it held is re-dispatched
            self.ledger.release_holder(old.instance)
            if old.pid != hello.pid:
                self._gone(old, "restarted")
        peer = self.registry.register(
            Peer(
                hello.service, hello.instance, identity, hello.host, hello.pid, hello.rank,
                dict(hello.fingerprint),
                opener=None if self.secret is None else Opener(session_key(self.secret, hello)),
                user_id=self.server.last_user_id,
            ),
            time.monotonic(),
        )  # fmt: skip
        if hello.service == "trainer" and hello.rank == 0 and hello.endpoints is not None:
            self.trainer_endpoints = hello.endpoints
            for other in self.registry.peers.values():
                if other.instance != peer.instance:
                    self.server.send(other.identity, self.welcome())
        if hello.service == "generator":
            self.shares.join(hello.instance, dict(hello.fingerprint))
        log.info(
            "peer.joined", service=hello.service, instance=hello.instance, host=hello.host,
            joined=peer.joined, devices=peer.describe()["devices"],
            identity=identity.decode(errors="backslashreplace"),
        )  # fmt: skip
        self.server.send(identity, self.welcome())

    def _on_leave(self, peer: Peer, reason: str) -> None:
        log.info("peer.leaving", instance=peer.instance, reason=reason)
        self.ledger.release_holder(peer.instance)
        self.registry.remove(peer.instance)
        self._gone(peer, reason)
        if peer.service == "trainer" and reason == "done":
            self.trainer_done = True
