"""The grouper hub: registry, dispatch with leases, group assembly, replay buffer, batches.

Invariants (see `grpo_stream.hub.ledger`):
- every dispatched group reaches the trainer at most once for its first use, and ends exactly
  once as trained, filtered, stale or failed;
- nothing staler than `hub.max_staleness` policy versions ships in a TrainBatch;
- nothing is pushed to a worker that did not ask: generators, scorers and teachers pull with
  credits.

The loop: `while running: poll the ROUTER; handle what arrived (a bounded burst); dispatch;
answer batch requests; check heartbeats and leases (every EXPIRY_EVERY_S); checkpoint now
and then`.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

# hub.batches.assemble needs torch: loaded at start, not on the first Scored, where seconds
# of import would stall the loop past every peer's heartbeat deadline
import torch  # noqa: F401

from grpo_stream.config import RunConfig
from grpo_stream.envs.registry import replayable
from grpo_stream.envs.turns import TurnFormat
from grpo_stream.exits import EXIT_ABORTED
from grpo_stream.hub import guard
from grpo_stream.hub.batches import step_stats
from grpo_stream.hub.curriculum import make_source
from grpo_stream.hub.dispatch import Dispatcher
from grpo_stream.hub.distill import step_kl
from grpo_stream.hub.intake import Intake
from grpo_stream.hub.journal import SendJournal
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.ledger_state import ledger_state, load_ledger
from grpo_stream.hub.payloads.direct import DirectPayloads
from grpo_stream.hub.registry import Peer, Registry
from grpo_stream.hub.replay import Group, ReplayBuffer
from grpo_stream.hub.serving import BatchDesk
from grpo_stream.hub.shares import ShareBook
from grpo_stream.hub.state import load_state, save_state
from grpo_stream.hub.status import hub_status
from grpo_stream.hub.transcript import Transcripts
from grpo_stream.hub.trust import TrustGate
from grpo_stream.hub.watchdog import Watchdog
from grpo_stream.models.loading import load_tokenizer
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.distill import Taught
from grpo_stream.protocols.episodes import EpisodeScored
from grpo_stream.protocols.payloads import PayloadLost, RolloutMeta
from grpo_stream.ratelimit import RateLimit
from grpo_stream.session.hub import HubSessions
from grpo_stream.tasks import make_task
from grpo_stream.transport.runsecret import resolve_secret
from grpo_stream.transport.sockets import Server, close_context, make_context

log = structlog.get_logger()

DRAIN_MAX = 256
"""Most messages handled between two ticks."""
DRAIN_S = 0.005
"""Longest time spent handling messages between two ticks."""
EXPIRY_EVERY_S = 0.1
"""How often the heartbeat and lease deadlines are checked (both are seconds or more)."""


class Grouper:
    """The hub service."""

    def __init__(self, cfg: RunConfig, resume: bool = False, secret: bytes | None = None) -> None:
        self.cfg = cfg
        # the run's secret: given (the CLI resolves it, environment included), else the file
        self.secret = secret or resolve_secret(cfg.security.secret_file, {})
        self.run_id = uuid.uuid4().hex[:12]
        self.run_dir = Path(cfg.run.run_dir)
        # to render prompts (chat template), check rollouts' content, read episodes' turns
        replayed = replayable(cfg.env)  # episodes' rewards: a scorer's replay, or trusted
        tokenizer = None
        if cfg.task.chat_template or cfg.security.check_content or replayed:
            tokenizer = load_tokenizer(cfg.model.name_or_path)
        self.task = make_task(cfg.task, tokenizer=tokenizer)
        hub = cfg.hub
        self.ledger = Ledger(
            groups_per_step=hub.groups_per_step,
            max_staleness=hub.max_staleness,
            lease_timeout_s=hub.lease_timeout_s,
            max_refill_ratio=hub.max_refill_ratio,
            refill_ahead=hub.refill_ahead,
            teach_timeout_s=cfg.teacher.timeout_s,
        )
        self.ledger.source = make_source(  # the curriculum, when on: one entry into dispatch
            hub.curriculum, self.task, cfg.generator.group_size, cfg.run.seed
        )
        self.buffer = ReplayBuffer(
            hub.replay.capacity, hub.replay.reuse, hub.replay.sampling, cfg.run.seed
        )
        self.registry = Registry(cfg.transport.heartbeat_timeout_s)
        self.rollouts: dict[int, m.Rollout] = {}
        self.trust = TrustGate(
            cfg, self.task, self.ledger, self.buffer, self.rollouts, self._refuse, tokenizer
        )
        self.shares = ShareBook(cfg.hardware)
        self.dispatcher = Dispatcher(
            cfg, self.ledger, self.registry, self.shares, self.task, self._send
        )
        self.journal = SendJournal(self.run_dir / "hub" / "sent.journal")
        self.desk = BatchDesk(
            hub=hub,
            ledger=self.ledger,
            buffer=self.buffer,
            send=self._send,
            stats=self._batch_stats,
            journal=self.journal,
            crash_limit=cfg.security.batch_crash_limit,
            checkpoint=self._checkpoint,
        )
        self.direct: DirectPayloads | None = None  # hub.payloads = "direct"
        if hub.payloads == "direct":  # payloads stay with their generators
            self.direct = DirectPayloads(
                group_size=cfg.generator.group_size,
                task=self.task,
                ledger=self.ledger,
                desk=self.desk,
                rollouts=self.rollouts,
                refuse=self._refuse,
                checkpoint=self._checkpoint,
            )
        self.transcripts = _transcripts(cfg, self.task, tokenizer, self.rollouts, replayed)
        self.intake = Intake(
            cfg=cfg,
            ledger=self.ledger,
            buffer=self.buffer,
            trust=self.trust,
            rollouts=self.rollouts,
            direct=self.direct,
            refuse=self._refuse,
            abort=self._abort,
            transcripts=self.transcripts,
        )
        self.teaching = self.intake.teaching  # algo.distill.teacher: groups wait for it
        self.ctx = make_context()
        self.server = Server(
            ctx=self.ctx,
            address=hub.bind,
            settings=cfg.transport,
            security=cfg.security,
            name="hub",
            guarded=self.secret is not None,
            setting="hub.bind",
        )
        self.sessions = HubSessions(
            cfg=cfg,
            server=self.server,
            registry=self.registry,
            ledger=self.ledger,
            shares=self.shares,
            facts=self,
            refuse=self._refuse,
            secret=self.secret,
        )
        self.sessions.on_gone.append(self._peer_gone)
        self._stop = False
        self._exit_code = 0
        self._shutdown_reason = "hub stopping"
        self._warn = RateLimit()
        self._last_ckpt = time.monotonic()
        self._next_expiry = 0.0  # the next check of heartbeat and lease deadlines
        self._state_path = self.run_dir / "hub" / "state.msgpack"
        self.resumed = resume
        self.watchdog = Watchdog(cfg.run, time.monotonic())  # says why no batch goes out
        if resume:
            self._restore()
        else:
            self.journal.reset()  # a fresh run: what an earlier one sent is not ours

    # ----- lifecycle ------------------------------------------------------------------
    def request_stop(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self._stop = True

    def serve(self) -> int:
        """Run until a Shutdown or a signal; returns the exit code. An exception propagates
        (the process exits non-zero and `up` restarts it) without a Shutdown to anyone."""
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        addr_file = self.run_dir / "hub.addr"
        addr_file.parent.mkdir(parents=True, exist_ok=True)
        addr_file.write_text(self.public_address() + "\n")
        log.info(
            "hub.started",
            address=self.server.address,
            public=self.public_address(),
            run_id=self.run_id,
        )
        deliberate = False
        try:
            while not self._stop:
                self._drain()
                self._tick()
            deliberate = True
        finally:
            if deliberate:  # only a deliberate stop ends the run: after a crash the services
                self._broadcast(m.Shutdown(reason=self._shutdown_reason))  # wait and rejoin
                self._checkpoint()
            else:  # the last checkpoint plus the send journal are consistent: keep them
                log.error("hub.crashed", **self.ledger.summary())
            log.info(
                "hub.stopped",
                **self.ledger.summary(),
                rejected=dict(self.server.rejected),
                challenged=self.sessions.challenged,
                dispatched_to=dict(self.dispatcher.dispatched),
                tokens_per_s=dict(self.shares.measured),
                verify_worst={k: round(v, 4) for k, v in self.trust.verifier.worst.items()},
                verify_groups=dict(self.trust.verifier.judged),
                quarantined=sorted(self.trust.quarantined),
                generators={p.instance: p.describe() for p in self.registry.of("generator")},
            )
            self.server.close()
            close_context(self.ctx)
        return self._exit_code

    def _drain(self) -> None:
        """Handle what has arrived (waiting up to 50 ms for the first message), up to
        `DRAIN_MAX` messages or `DRAIN_S` seconds, before the next tick: the tick's work
        (dispatch, serving, expiry) grows with the connected peers, so it is paid once per
        burst instead of once per message; the bound keeps dispatch latency short."""
        got = self.server.recv(timeout_ms=50)
        deadline = time.monotonic() + DRAIN_S
        handled = 0
        while got is not None:
            self._handle(*got)
            handled += 1
            if self._stop or handled >= DRAIN_MAX or time.monotonic() > deadline:
                return
            got = self.server.recv(timeout_ms=0)

    def public_address(self) -> str:
        return self.cfg.hub.public_address or self.server.address

    def _tick(self) -> None:
        now = time.monotonic()
        self.shares.maybe_refit(now)
        if now >= self._next_expiry:  # scans every peer and lease: a few times a second
            self._next_expiry = now + EXPIRY_EVERY_S
            self.sessions.expire(now)
            expired = self.ledger.expire(now)
            if expired:
                log.warning("lease.expired", groups=expired)
        self._dispatch(now)
        self.desk.serve()
        last = self.desk.last
        fault = self.cfg.hub.fault_raise_at_step
        if fault is not None and not self.resumed and last is not None and last.step >= fault:
            raise RuntimeError(f"hub.fault_raise_at_step={fault}: injected hub exception")
        self.watchdog.check(now, self)
        if now - self._last_ckpt > self.cfg.hub.checkpoint_every_s:
            self._checkpoint()

    # ----- messages -------------------------------------------------------------------
    def _handle(self, identity: bytes, msg: m.Message) -> None:
        if isinstance(msg, m.StatusRequest):
            if self.sessions.may_read_status(identity, msg):
                status = hub_status(
                    self.ledger, self.registry, len(self.buffer), self.server.rejected
                )
                self.server.send(identity, status)
            return
        peer = self.sessions.handle(identity, msg)  # Hello, Heartbeat, credits, Shutdown
        if self.sessions.trainer_done:
            self._stop = True
        if peer is None:
            return
        handlers: dict[type[m.Message], Callable[[Peer, Any], None]] = {
            m.Scored: self.intake.on_scored,
            m.BatchRequest: self._on_batch_request,
            m.RolloutEvidence: lambda _, msg: self.trust.evidence(msg),
            Taught: self.intake.on_taught,
            EpisodeScored: self.intake.on_episode_scored,
        }
        if self.direct is None:
            handlers[m.Rollout] = self.intake.on_rollout
        else:
            handlers.update({RolloutMeta: self.intake.on_meta, PayloadLost: self.direct.on_lost})
        handler = handlers.get(type(msg))
        wrong_role = guard.check_role(peer.service, msg)
        if wrong_role is not None:
            self._refuse(identity, "wrong_role", wrong_role, msg.KIND)
            return
        if handler is None:
            self.server.rejected["unexpected_kind"] += 1
            self.server.send(
                identity, m.Error(code="unexpected_kind", message=f"hub does not take {msg.KIND}")
            )
            return
        handler(peer, msg)

    def _refuse(self, identity: bytes, code: str, reason: str, kind: str) -> None:
        """A message that fails a check against the hub's state: counted, answered, logged
        (rate-limited; an error event for what only an untrusted sender does, `guard.TRUST`);
        nothing changed."""
        self.server.rejected[code] += 1
        count = self._warn.allow(f"refused:{code}")
        if count is not None:
            emit = log.error if code in guard.TRUST else log.warning
            emit("hub.refused", code=code, reason=reason, kind=kind, count=count)
        self.server.send(identity, m.Error(code=code, message=reason, in_reply_to=kind))

    def _peer_gone(self, peer: Peer, why: str) -> None:
        """A peer lost (silent), left, dropped (bad seal) or restarted, each told only once
        its session checked out (signature, seal): the ledger has what it held back; here,
        what the grouper keeps besides (a generator's store is gone with its process)."""
        if peer.service == "trainer":
            self.desk.drop(peer.identity)
            if peer.rank == 0 and why != "done":
                self.desk.trainer_died()
        elif peer.service == "generator" and self.direct is not None:
            self.direct.holder_lost(peer.instance, why)

    @property
    def window_rewards(self) -> list[float]:
        """Rewards of the groups filtered as zero-signal since the last step served."""
        return self.intake.window_rewards

    @property
    def scorers_needed(self) -> bool:
        """Whether groups wait for scorers: single-turn ones, and episodes a scorer replays."""
        return not self.cfg.env.enabled or self.transcripts is not None

    @property
    def policy_version(self) -> int:
        """The trainer's version as the Ledger (its one owner) knows it: told in Welcome."""
        return self.ledger.versions.trainer_version

    def _abort(self, reason: str) -> None:
        log.error("run.aborted", error=reason)
        self._stop = True
        self._exit_code = EXIT_ABORTED
        self._shutdown_reason = f"aborted: {reason}"

    def _on_batch_request(self, peer: Peer, msg: m.BatchRequest) -> None:
        refused = self.desk.refusal(msg, self.cfg.trainer.ranks)
        if refused is not None:
            self._refuse(peer.identity, "bad_batch_request", refused, msg.KIND)
            return
        self.desk.add(peer.identity, msg)  # the desk tells the ledger the trainer's version

    # ----- work out ---------------------------------------------------------------------
    def _dispatch(self, now: float) -> None:
        self.dispatcher.generators(now, self.trust.quarantined)
        self.dispatcher.scorers(now, self.rollouts, self.direct or self.transcripts)
        if self.teaching is not None:
            self.dispatcher.teachers(now, self.teaching)

    def _batch_stats(self, groups: list[Group]) -> m.StepStats:
        """A step's statistics; the filtered groups' rewards start a new window."""
        stats = step_stats(
            groups,
            self.intake.window_rewards,
            self.ledger,
            self.registry.of("generator"),
            len(self.buffer),
            self.registry.lost_total,
            step_kl(groups),
            self.registry.of("scorer"),
        )
        self.intake.window_rewards = []
        return stats

    def _send(self, identity: bytes, msg: m.Message) -> bool:
        return self.server.send(identity, msg)

    def _broadcast(self, msg: m.Message) -> None:
        for peer in self.registry.peers.values():
            self.server.send(peer.identity, msg)

    # ----- checkpoint -------------------------------------------------------------------
    def _checkpoint(self) -> None:
        self._last_ckpt = time.monotonic()
        if self.direct is not None:
            self.direct.prune()
        save_state(
            self._state_path,
            {
                "run_id": self.run_id,
                "ledger": ledger_state(self.ledger),
                "buffer": self.buffer.state(),
                "recent_rewards": list(self.intake.recent_rewards),
                "desk": self.desk.state(),
            },
        )
        self.journal.reset()  # the checkpoint covers every record (a crash here: replay skips)
        (self.run_dir / "hub" / "counters.json").write_text(json.dumps(self.ledger.summary()))

    def _restore(self) -> None:
        state = load_state(self._state_path)
        if state is None:
            log.info("hub.fresh_start", reason="no checkpoint", path=str(self._state_path))
        else:
            self.run_id = str(state["run_id"])
            self.buffer.load_state(state["buffer"])
            load_ledger(self.ledger, state["ledger"], scored=set())
            self.intake.recent_rewards.extend(float(r) for r in state["recent_rewards"])
            self.desk.load_state(state["desk"])
        # sends the checkpoint does not cover (all of them if the hub never wrote one)
        replayed = [r for r in self.journal.read() if r.seq > self.desk.seq]
        for record in replayed:
            self.desk.replay(record)
        self.ledger.check_invariant()
        log.info(
            "hub.resumed",
            **self.ledger.summary(),
            buffer=len(self.buffer),
            journal_replayed=len(replayed),
        )


def _transcripts(
    cfg: RunConfig, task: Any, tokenizer: Any, rollouts: dict[int, m.Rollout], replayed: bool
) -> Transcripts | None:
    """Episodes a scorer replays (None: single-turn, or an environment that cannot be
    replayed, whose rewards are then its generator's: said here, once, as a warning)."""
    if not cfg.env.enabled:
        return None
    if not replayed:
        why = "no scorer can replay this environment: its episodes' rewards are the generator's"
        log.warning("env.rewards_trusted", env=cfg.env.agent or cfg.env.name, reason=why)
        return None
    fmt = TurnFormat(tokenizer, cfg.task.chat_template, cfg.env.format)
    tokens = fmt.tokens if cfg.security.check_content else None
    return Transcripts(task, tokenizer, cfg.env, tokens, rollouts)


def run_grouper(cfg: RunConfig, resume: bool = False, secret: bytes | None = None) -> int:
    return Grouper(cfg, resume=resume, secret=secret).serve()
