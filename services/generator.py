"""The generator service: pull prompts with credits, sample G completions, send Rollouts.

Invariants:
- it never holds more prompts than it asked for (credits);
- a batch is generated with a policy version >= the batch's `min_version` (it waits for
  and applies that version first), and each Rollout says which version produced it;
- weights are applied between batches, a whole version at a time; with
  generator.inflight_updates they are fetched on a thread and also swapped in between
  decoding steps (hf), and each Rollout then carries per-token version runs whose oldest is
  its policy_version;
- a streaming engine (vllm) runs `generator_stream.StreamLoop` instead of the batch loop:
  each prompt is its own request and each group is sent as soon as it is done; versions are
  fetched and applied in the background (the engine pauses vLLM around each);
- an engine that cannot go on (its process died, a version failed twice) ends the service
  with `EXIT_ENGINE_FAILED` (`generator_main`, which builds the engine and runs the service).
"""

from __future__ import annotations

import time
from collections import deque

import structlog

from grpo_stream.config import RunConfig
from grpo_stream.engines import Engine
from grpo_stream.engines.hf import HFEngine
from grpo_stream.engines.inflight import InflightEngine
from grpo_stream.engines.streaming import StreamingEngine
from grpo_stream.envs.service import Player, episode_rollout
from grpo_stream.hub.payloads.store import PayloadOutbox, Sender
from grpo_stream.protocols import messages as m
from grpo_stream.ratelimit import RateLimit
from grpo_stream.sampling import GroupSample, Sampling
from grpo_stream.services.credits import credit_window
from grpo_stream.services.generator_stream import Hooks, StreamLoop
from grpo_stream.services.rollouts import empty_rollout, group_rollout
from grpo_stream.session.service import Session
from grpo_stream.transport.errors import TransportError
from grpo_stream.transport.fetch import WeightsWatcher

log = structlog.get_logger()
FETCH_BACKOFF_MAX_S = 30.0  # longest wait between two tries of a dead weight server


class Generator:
    """One inference engine serving the hub."""

    def __init__(
        self,
        link: Session,
        engine: Engine,
        throttle: float = 1.0,
        player: Player | None = None,
        weights_noise: float = 0.0,
    ) -> None:
        self.link = link
        self.player = player  # plays batches as episodes (env.name or env.agent set)
        self.engine = engine
        self.stop = link.stop
        self.queue: deque[m.PromptBatch] = deque()
        self.credits = credit_window(self.cfg, engine)  # prompts it asks the hub for
        self.watcher: WeightsWatcher | None = None
        self.watched: str | None = None
        self.reload = False  # the trainer restarted: take its newest version whatever its number
        self.announced = link.policy_version  # the hub knows the trainer's version
        self._waiting_since: float | None = None
        self.tokens_per_s = 0.0
        self.wait_s = 0.0
        self.batches = 0
        self.throttle = throttle
        self.weights_noise = weights_noise  # test hook: sample from another model (`_perturb`)
        self.prompts_total = 0
        self.tokens_total = 0
        self.busy_s = 0.0
        self._fetch_failures = 0  # weight fetches failed in a row
        self._fetch_retry_at = 0.0
        self._warn = RateLimit()
        self.apply_s = 0.0  # main-thread seconds spent fetching/applying weights
        self._restarts = 0  # trainer restarts seen (a background fetch started before one is old)
        self._fetch_started: tuple[float, int] | None = None  # background fetch: (t0, restarts)
        # episodes play whole batches; any other work streams when the engine can
        self.streaming = player is None and isinstance(engine, StreamingEngine)
        self.out: Sender = link  # hub.payloads = "direct": Rollouts stay in our store
        if self.cfg.hub.payloads == "direct":
            self.out = PayloadOutbox(
                link, link.ctx, self.cfg, link.security, guarded=link.secret is not None
            )
        link.on_rejoin(self._rejoined)

    @property
    def cfg(self) -> RunConfig:
        return self.link.cfg

    def _rejoined(self) -> None:
        """The hub (re)registered us: what we held is re-dispatched, the trainer's version is
        the hub's (the session asked for the credit window again)."""
        self.queue.clear()
        self._waiting_since = None
        self.announced = max(self.announced, self.link.policy_version)

    def serve(self) -> None:
        self._perturb()
        try:
            if isinstance(self.engine, StreamingEngine) and self.streaming:
                self._stream(self.engine)
            else:
                self._serve()
        finally:
            if isinstance(self.out, PayloadOutbox):
                self.out.close()

    def _serve(self) -> None:
        self.link.pull(2 * self.credits.start)
        while not self.stop.set:
            idle = not self.queue
            t0 = time.perf_counter()
            self._receive(timeout_ms=0 if self.queue else 50)
            if idle:  # time spent waiting for work (credits outstanding, nothing to do)
                self.wait_s += time.perf_counter() - t0
            self._poll_weights()
            if not self.queue:
                continue
            batch = self.queue[0]
            if not self._ensure_version(batch.min_version):
                continue  # still waiting (and a rejoin meanwhile dropped the queue)
            self.queue.popleft()
            self._generate(batch)
            self.link.replenish(len(batch.prompts))

    def _stream(self, engine: StreamingEngine) -> None:
        hooks = Hooks(
            turn=self._stream_turn, version_ready=self._version_ready,
            send=self._send_rollout, account=self._account, waited=self._waited,
        )  # fmt: skip
        StreamLoop(engine, self.link, self.queue, self.cfg.run.seed, hooks).run(self.credits)

    def _stream_turn(self) -> None:
        """One turn of the streaming loop: the hub's messages, the trainer's versions (a
        newer one is fetched and applied in the background)."""
        self._receive(timeout_ms=0)
        self._poll_weights()
        behind = self.announced > self.engine.version or self.reload
        if (behind or self._fetch_started is not None) and self.link.peers is not None:
            self._fetch_weights()

    def _waited(self, seconds: float) -> None:
        self.wait_s += seconds

    def _receive(self, timeout_ms: int) -> None:
        msg = self.link.recv(timeout_ms)
        while msg is not None:
            if isinstance(msg, m.PromptBatch):
                self.queue.append(msg)
            msg = self.link.recv(0)

    def _poll_weights(self) -> None:
        """Follow the trainer's announcements. A new announce address means a restarted
        trainer, whose versions restart from its checkpoint: reload from it in any case."""
        peers = self.link.peers
        address = None if peers is None else peers.announce
        if address is not None and address != self.watched:
            if self.watcher is not None:
                self.watcher.close()
                self.reload = True
                self._restarts += 1
            self.watcher = WeightsWatcher(
                self.link.ctx, address, self.cfg.transport, self.link.security
            )
            self.watched = address
        if self.watcher is not None:
            seen = self.watcher.poll(0)
            if seen is not None:
                self.announced = max(self.announced, seen)

    def _ensure_version(self, min_version: int) -> bool:
        """Apply the trainer's newest version when one was announced (or, on joining, when
        the hub says the trainer is ahead of us), then check the batch's `min_version`."""
        behind = self.announced > self.engine.version or self.reload
        if (behind or self._fetch_started is not None) and self.link.peers is not None:
            self._fetch_weights()
        if self._version_ready(min_version):
            return True
        self._receive(timeout_ms=20)  # let the trainer publish
        return False

    def _version_ready(self, min_version: int) -> bool:
        """The engine holds `min_version` or newer. If that version does not come within the
        heartbeat deadline (the trainer rolled a step back, say), generate anyway: the hub
        drops what is too stale, counted."""
        now = time.monotonic()
        if self.engine.version >= min_version:
            self._waiting_since = None
            return True
        if self._waiting_since is None:
            self._waiting_since = now
        if now - self._waiting_since > self.cfg.transport.heartbeat_timeout_s:
            log.warning("weights.wait_expired", need=min_version, have=self.engine.version)
            self._waiting_since = None
            return True
        return False

    def _fetch_weights(self) -> None:
        """Fetch and apply the newest version. A weight server that died or refuses (the
        trainer crashed after a publish, or is restarting) is retried with exponential
        backoff, each time at the address the hub last gave: a restarted trainer says Hello
        with its new endpoints and the hub pushes them to every peer in a Welcome."""
        now = time.monotonic()
        if now < self._fetch_retry_at:
            return
        peers = self.link.peers
        if peers is None:
            return
        address = peers.weights
        background = self.cfg.generator.inflight_updates or self.streaming
        if isinstance(self.engine, InflightEngine) and background:
            self._fetch_in_background(self.engine, address)
            return
        t0 = time.perf_counter()
        try:
            version = self.engine.update_from_server(address, -1)
        except TransportError as exc:
            self._fetch_failed(address, exc)
            return
        self.apply_s += time.perf_counter() - t0
        self._fetched(version, time.perf_counter() - t0, fresh=True)

    def _fetch_in_background(self, engine: InflightEngine, address: str) -> None:
        """Apply what a background fetch brought, then start the next one if still behind."""
        t0 = time.perf_counter()
        try:
            version = engine.take_fetched()
        except TransportError as exc:
            self._fetch_started = None
            self._fetch_failed(address, exc)
            return
        if version is not None:
            self.apply_s += time.perf_counter() - t0
            started, restarts = self._fetch_started or (t0, self._restarts)
            self._fetch_started = None
            self._fetched(version, time.perf_counter() - started, restarts == self._restarts)
        behind = self.announced > self.engine.version or self.reload
        if behind and engine.fetch_in_background(address):
            self._fetch_started = (time.perf_counter(), self._restarts)

    def _fetch_failed(self, address: str, exc: TransportError) -> None:
        self._fetch_failures += 1
        backoff = min(FETCH_BACKOFF_MAX_S, 2.0 ** (self._fetch_failures - 1))
        self._fetch_retry_at = time.monotonic() + backoff
        self.reload = True  # whatever the newest version is once the server is back
        count = self._warn.allow("weights.fetch_failed")
        if count is not None:
            log.warning(
                "weights.fetch_failed",
                address=address,
                error=str(exc),
                failures=self._fetch_failures,
                retry_in_s=backoff,
                count=count,
            )

    def _fetched(self, version: int, seconds: float, fresh: bool) -> None:
        """`fresh`: fetched from the trainer the hub names now (not one since restarted)."""
        self.reload = self.reload and not fresh
        self._fetch_failures = 0
        self.announced = version  # the server's newest is the truth
        log.info("weights.applied", version=version, seconds=round(seconds, 4))
        self._perturb()

    def _perturb(self) -> None:
        """Test hook (`--fault-weights-noise`): the weights just applied times (1 + noise x
        N(0, 1)), so this generator samples from another model than the version it claims
        (what verified rollouts must catch)."""
        if self.weights_noise <= 0:
            return
        import torch  # heavy: this module loads it only where a service runs (generator_main)

        if not isinstance(self.engine, HFEngine):
            raise ValueError("--fault-weights-noise needs generator.engine = 'hf'")
        with torch.no_grad():
            for p in self.engine.model.parameters():
                p.mul_(1 + self.weights_noise * torch.randn_like(p))
        log.warning("weights.perturbed", noise=self.weights_noise, version=self.engine.version)

    def between_steps(self) -> None:
        """In-flight updates (the engine calls this between decoding steps): follow the
        announcements and swap in a version fetched meanwhile."""
        self._poll_weights()
        pending = self._fetch_started is not None
        if (self.announced > self.engine.version or self.reload or pending) and (
            self.link.peers is not None
        ):
            self._fetch_weights()

    def _generate(self, batch: m.PromptBatch) -> None:
        if self.player is not None:
            self._play(batch)
            return
        t0 = time.perf_counter()
        samples = self.engine.generate(list(batch.prompts), batch.group_size, self._sampling(batch))
        seconds = time.perf_counter() - t0
        if self.throttle > 1:  # test hook: behave like a slower device
            time.sleep((self.throttle - 1) * seconds)
            seconds *= self.throttle
        tokens = 0
        for gid, sample in zip(batch.group_ids, samples, strict=False):
            tokens += self._send_rollout(batch, int(gid), sample, seconds)
        self._account(len(samples), tokens, seconds)

    def _play(self, batch: m.PromptBatch) -> None:
        """The batch as episodes against the environment (env.name set)."""
        player = self.player
        if player is None:
            raise RuntimeError("episodes need an EpisodePlayer (env.name set)")
        t0 = time.perf_counter()
        groups = player.play(batch, self._sampling(batch))
        seconds = time.perf_counter() - t0
        tokens = 0
        for gid, eps in zip(batch.group_ids, groups, strict=True):
            head = empty_rollout(batch, int(gid), self.link.instance, self.engine.version,
                                 seconds)  # fmt: skip
            rollout = episode_rollout(head, eps)
            tokens += int(rollout.loss_mask.sum())
            self.link.send(rollout)
        self.link.stats.update(player.stats())
        self._account(len(groups), tokens, seconds)

    def _sampling(self, batch: m.PromptBatch) -> Sampling:
        """The batch's sampling, seeded by the run's seed and the lease."""
        return Sampling.of(batch.sampling, self.cfg.run.seed).child(int(batch.lease_id))

    def _account(self, prompts: int, tokens: int, seconds: float, batches: int = 1) -> None:
        self.batches += batches
        self.prompts_total += prompts
        self.tokens_total += tokens
        self.busy_s += seconds
        # throughput while generating (idle time excluded): what this device can deliver
        self.tokens_per_s = self.tokens_total / max(self.busy_s, 1e-9)
        self.link.generator_stats = m.GeneratorStats(
            tokens_per_s=round(self.tokens_per_s, 2),
            wait_s=round(self.wait_s, 3),
            version=self.engine.version,
            batches=self.batches,
            prompts_total=self.prompts_total,
            busy_s=round(self.busy_s, 3),
        )
        log.debug("batch.generated", prompts=prompts, tokens=tokens, seconds=round(seconds, 3))

    def _send_rollout(
        self,
        batch: m.PromptBatch,
        group_id: int,
        sample: GroupSample,
        seconds: float,
    ) -> int:
        rollout = group_rollout(batch, group_id, self.link.instance, sample, seconds,
                                self.engine.version)  # fmt: skip
        self.out.send(rollout)
        return len(rollout.completion_ids)
