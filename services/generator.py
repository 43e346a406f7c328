"""The generator service: pull prompts with credits, sample G completions, send Rollouts.

Invariants:
- it never holds more prompts than it asked for (credits);
- a batch is generated with a policy version >= the batch's `min_version` (it waits for
  and applies that version first), and each Rollout says which version produced it;
- weights are applied between batches, a whole version at a time; with
  generator.inflight_updates they are fetched on a thread and also swapped in between
  decoding steps (hf), and each Rollout then carries per-token version runs whose oldest is
  its policy_version.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import structlog

from grpo_stream.config import RunConfig
from grpo_stream.engines import Completion, Engine, GroupSample, make_engine
from grpo_stream.engines.inflight import InflightEngine
from grpo_stream.envs.service import EpisodePlayer
from grpo_stream.hub.payload_store import PayloadOutbox, Sender
from grpo_stream.protocols import messages as m
from grpo_stream.ratelimit import RateLimit
from grpo_stream.session.service import Join, Session, run_service
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
        player: EpisodePlayer | None = None,
    ) -> None:
        self.link = link
        self.player = player  # plays batches as episodes (env.name set)
        self.engine = engine
        self.stop = link.stop
        self.queue: deque[m.PromptBatch] = deque()
        self.credits = self.cfg.generator.prompts_per_request
        self.watcher: WeightsWatcher | None = None
        self.watched: str | None = None
        self.reload = False  # the trainer restarted: take its newest version whatever its number
        self.announced = link.policy_version  # the hub knows the trainer's version
        self._waiting_since: float | None = None
        self.tokens_per_s = 0.0
        self.wait_s = 0.0
        self.batches = 0
        self.throttle = throttle
        self.prompts_total = 0
        self.tokens_total = 0
        self.busy_s = 0.0
        self._fetch_failures = 0  # weight fetches failed in a row
        self._fetch_retry_at = 0.0
        self._warn = RateLimit()
        self.apply_s = 0.0  # main-thread seconds spent fetching/applying weights
        self._restarts = 0  # trainer restarts seen (a background fetch started before one is old)
        self._fetch_started: tuple[float, int] | None = None  # background fetch: (t0, restarts)
        self.out: Sender = link  # hub.payloads = "direct": Rollouts stay in our store
        if self.cfg.hub.payloads == "direct":
            self.out = PayloadOutbox(link, link.ctx, self.cfg, link.security)
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
        try:
            self._serve()
        finally:
            if isinstance(self.out, PayloadOutbox):
                self.out.close()

    def _serve(self) -> None:
        self.link.pull(2 * self.credits)
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

    def _receive(self, timeout_ms: int) -> None:
        msg = self.link.recv(timeout_ms)
        while msg is not None:
            if isinstance(msg, m.PromptBatch):
                self.queue.append(msg)
            msg = self.link.recv(0)

    def _poll_weights(self) -> None:
        """Follow the trainer's announcements. A new announce address means a restarted
        trainer, whose versions restart from its checkpoint: reload from it in any case."""
        address = self.link.peers.get("announce")
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
        the hub says the trainer is ahead of us), then check the batch's `min_version`.
        If that version does not come within the heartbeat deadline (the trainer rolled a
        step back, say), generate anyway: the hub drops what is too stale, counted."""
        behind = self.announced > self.engine.version or self.reload
        if (behind or self._fetch_started is not None) and "weights" in self.link.peers:
            self._fetch_weights()
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
        self._receive(timeout_ms=20)  # let the trainer publish
        return False

    def _fetch_weights(self) -> None:
        """Fetch and apply the newest version. A weight server that died or refuses (the
        trainer crashed after a publish, or is restarting) is retried with exponential
        backoff, each time at the address the hub last gave: a restarted trainer says Hello
        with its new endpoints and the hub pushes them to every peer in a Welcome."""
        now = time.monotonic()
        if now < self._fetch_retry_at:
            return
        address = self.link.peers["weights"]
        if isinstance(self.engine, InflightEngine) and self.cfg.generator.inflight_updates:
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

    def between_steps(self) -> None:
        """In-flight updates (the engine calls this between decoding steps): follow the
        announcements and swap in a version fetched meanwhile."""
        self._poll_weights()
        pending = self._fetch_started is not None
        if (self.announced > self.engine.version or self.reload or pending) and (
            "weights" in self.link.peers
        ):
            self._fetch_weights()

    def _generate(self, batch: m.PromptBatch) -> None:
        if self.player is not None:
            self._play(batch)
            return
        t0 = time.perf_counter()
        samples = self.engine.generate(
            list(batch.prompts),
            batch.group_size,
            batch.sampling.max_tokens,
            batch.sampling.temperature,
            batch.sampling.top_p,
            seed=self.cfg.run.seed * 1_000_003 + int(batch.lease_id),
        )
        seconds = time.perf_counter() - t0
        if self.throttle > 1:  # test hook: behave like a slower device
            time.sleep((self.throttle - 1) * seconds)
            seconds *= self.throttle
        tokens = 0
        for gid, prompt, ref, sample in zip(
            batch.group_ids, batch.prompts, batch.references, samples, strict=False
        ):
            tokens += self._send_rollout(batch, int(gid), prompt, dict(ref), sample, seconds)
        self._account(len(samples), tokens, seconds)

    def _play(self, batch: m.PromptBatch) -> None:
        """The batch as episodes against the environment (env.name set)."""
        from grpo_stream.envs.service import episode_rollout

        player = self.player
        if player is None:
            raise RuntimeError("episodes need an EpisodePlayer (env.name set)")
        t0 = time.perf_counter()
        seed = self.cfg.run.seed * 1_000_003 + int(batch.lease_id)
        groups = player.play(batch, seed)
        seconds = time.perf_counter() - t0
        tokens = 0
        for gid, prompt, ref, eps in zip(
            batch.group_ids, batch.prompts, batch.references, groups, strict=True
        ):
            head = _rollout(batch, int(gid), self.link.instance, self.engine.version,
                            prompt, dict(ref), seconds)  # fmt: skip
            rollout = episode_rollout(head, eps)
            tokens += int(rollout.loss_mask.sum())
            self.link.send(rollout)
        self.link.stats.update(
            episodes=player.episodes,
            episodes_failed=player.failed,
            episodes_truncated=player.truncated,
        )
        self._account(len(groups), tokens, seconds)

    def _account(self, prompts: int, tokens: int, seconds: float) -> None:
        self.batches += 1
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
        prompt: str,
        ref: dict[str, object],
        sample: GroupSample,
        seconds: float,
    ) -> int:
        comps = sample.completions
        lengths = [len(c.token_ids) for c in comps]
        offsets = np.zeros(len(comps) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(lengths)
        flat_ids = [t for c in comps for t in c.token_ids]
        flat_lp = [lp for c in comps for lp in c.logprobs]
        starts, versions = token_version_runs(comps, offsets, self.engine.version)
        self.out.send(
            m.Rollout(
                lease_id=batch.lease_id,
                group_id=group_id,
                instance=self.link.instance,
                policy_version=min(versions),
                prompt=prompt,
                reference=ref,
                prompt_ids=np.array(sample.prompt_ids, dtype=np.int32),
                completion_ids=np.array(flat_ids, dtype=np.int32),
                completion_offsets=offsets,
                logprobs=np.array(flat_lp, dtype=np.float32),
                texts=[c.text for c in comps],
                truncated=[c.truncated for c in comps],
                gen_seconds=seconds,
                sampling=batch.sampling,
                token_version_starts=_on_wire(starts, versions),
                token_versions=_on_wire(versions, versions),
            )
        )
        return int(offsets[-1])


def token_version_runs(
    comps: list[Completion], offsets: np.ndarray, version: int
) -> tuple[list[int], list[int]]:
    """(starts in the flat completion ids, versions) of the group's runs of tokens sampled
    with one version; a completion without runs was sampled wholly by `version`."""
    starts: list[int] = []
    versions: list[int] = []
    for c, off in zip(comps, offsets[:-1].tolist(), strict=True):
        for start, v in c.version_runs or [(0, version)]:
            if not versions or versions[-1] != v:
                starts.append(off + start)
                versions.append(v)
    return starts or [0], versions or [version]


def _on_wire(values: list[int], versions: list[int]) -> np.ndarray:
    """A run field of the Rollout: empty (the wire as before) when one version sampled all."""
    return np.array(values if len(set(versions)) > 1 else [], dtype=np.int64)


def _rollout(
    batch: m.PromptBatch,
    group_id: int,
    instance: str,
    version: int,
    prompt: str,
    ref: dict[str, object],
    seconds: float,
) -> m.Rollout:
    """A Rollout with its identity filled in and no completions yet."""
    empty = np.zeros(0, dtype=np.int32)
    return m.Rollout(
        lease_id=batch.lease_id, group_id=group_id, instance=instance, policy_version=version,
        prompt=prompt, reference=ref, prompt_ids=empty, completion_ids=empty,
        completion_offsets=np.zeros(1, dtype=np.int64), logprobs=np.zeros(0, dtype=np.float32),
        texts=[], truncated=[], gen_seconds=seconds, sampling=batch.sampling,
    )  # fmt: skip


def run_generator(join: Join, throttle: float = 1.0) -> int:
    return run_service(join, lambda session: serve_generator(session, throttle))


def serve_generator(session: Session, throttle: float = 1.0) -> int:
    """Build the engine from the run's config, serve until stopped."""
    import torch

    cfg = session.cfg
    torch.manual_seed(cfg.run.seed)
    engine = make_engine(
        cfg.generator.engine,
        cfg.model,
        cfg.generator,
        cfg.transport,
        session.security,
        lora=cfg.trainer.lora,
        weights=cfg.weights,
    )
    log.info("generator.ready", engine=cfg.generator.engine, model=cfg.model.name_or_path)
    player = None
    if cfg.env.enabled:
        from grpo_stream.engines.hf import HFEngine
        from grpo_stream.engines.vllm import VLLMEngine

        if not isinstance(engine, HFEngine | VLLMEngine):  # both have complete and tokenizer
            raise ValueError("env.name needs generator.engine = 'hf' or 'vllm'")
        player = EpisodePlayer(cfg.env, engine, engine.tokenizer, cfg.task.chat_template)
        player.__enter__()
    try:
        generator = Generator(
            session, engine, throttle=max(throttle, cfg.generator.throttle), player=player
        )
        if cfg.generator.inflight_updates and isinstance(engine, InflightEngine):
            engine.enable_inflight(generator.between_steps, cfg.generator.inflight_kv == "keep")
        generator.serve()
    finally:
        if player is not None:
            player.__exit__()
        engine.close()
    return 0
