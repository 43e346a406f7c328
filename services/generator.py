"""The generator service: pull prompts with credits, sample G completions, send Rollouts.

Invariants:
- it never holds more prompts than it asked for (credits);
- a batch is generated with a policy version >= the batch's `min_version` (it waits for
  and applies that version first), and each Rollout says which version produced it;
- weights follow the trainer (`grpo_stream.engines.follower`, whose `VersionTracker` is the one
  rule for "behind"): applied between batches, a whole version at a time; with
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
from dataclasses import dataclass

import structlog

from grpo_stream.config import RunConfig
from grpo_stream.engines import Engine
from grpo_stream.engines.follower import WeightsFollower
from grpo_stream.engines.hf import HFEngine
from grpo_stream.engines.streaming import StreamingEngine
from grpo_stream.envs.service import Player, episode_rollout
from grpo_stream.hub.payloads.store import PayloadOutbox, Sender
from grpo_stream.protocols import messages as m
from grpo_stream.sampling import GroupSample, Sampling
from grpo_stream.services.credits import credit_window
from grpo_stream.services.generator_stream import Hooks, StreamLoop
from grpo_stream.services.rollouts import empty_rollout, group_rollout
from grpo_stream.session.service import Session

log = structlog.get_logger()


@dataclass
class Counters:
    """What the generator has done, for its heartbeat's GeneratorStats."""

    batches: int = 0
    prompts_total: int = 0
    tokens_total: int = 0
    busy_s: float = 0.0  # generating
    wait_s: float = 0.0  # with credits out and nothing to do

    def add(self, prompts: int, tokens: int, seconds: float, batches: int) -> None:
        self.batches += batches
        self.prompts_total += prompts
        self.tokens_total += tokens
        self.busy_s += seconds

    def stats(self, version: int) -> m.GeneratorStats:
        # throughput while generating (idle time excluded): what this device can deliver
        tokens_per_s = self.tokens_total / max(self.busy_s, 1e-9)
        return m.GeneratorStats(
            tokens_per_s=round(tokens_per_s, 2),
            wait_s=round(self.wait_s, 3),
            version=version,
            batches=self.batches,
            prompts_total=self.prompts_total,
            busy_s=round(self.busy_s, 3),
        )


class Generator:
    """One inference engine serving the hub: the queue of PromptBatches it was given, the
    batch or streaming loop, and the Rollouts it sends; its weights follow the trainer
    (`weights`, grpo_stream.engines.follower)."""

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
        self.throttle = throttle
        self.weights_noise = weights_noise  # test hook: sample from another model (`_perturb`)
        self.counters = Counters()
        # episodes play whole batches; any other work streams when the engine can
        self.streaming = player is None and isinstance(engine, StreamingEngine)
        self.weights = WeightsFollower(
            engine,
            link,
            self.cfg.transport,
            background=self.cfg.generator.inflight_updates or self.streaming,
            wait_limit_s=self.cfg.transport.heartbeat_timeout_s,
            on_applied=self._perturb,
        )
        self.weights.rejoined(link.policy_version)  # the hub knows the trainer's version
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
        self.weights.rejoined(self.link.policy_version)

    def serve(self) -> None:
        self._perturb()
        try:
            if isinstance(self.engine, StreamingEngine) and self.streaming:
                self._stream(self.engine)
            else:
                self._serve()
        finally:
            self.weights.close()
            if isinstance(self.out, PayloadOutbox):
                self.out.close()

    def _serve(self) -> None:
        self.link.pull(2 * self.credits.start)
        while not self.stop.set:
            idle = not self.queue
            t0 = time.perf_counter()
            self._receive(timeout_ms=0 if self.queue else 50)
            if idle:  # time spent waiting for work (credits outstanding, nothing to do)
                self.counters.wait_s += time.perf_counter() - t0
            self.weights.poll()
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
            turn=self._stream_turn,
            version_ready=self.weights.ready_for,
            send=self._send_rollout,
            account=self._account,
            waited=self._waited,
        )
        StreamLoop(engine, self.link, self.queue, self.cfg.run.seed, hooks).run(self.credits)

    def _stream_turn(self) -> None:
        """One turn of the streaming loop: the hub's messages, the trainer's versions (a
        newer one is fetched and applied in the background)."""
        self._receive(timeout_ms=0)
        self.weights.poll()
        self.weights.update()

    def _waited(self, seconds: float) -> None:
        self.counters.wait_s += seconds

    def _receive(self, timeout_ms: int) -> None:
        msg = self.link.recv(timeout_ms)
        while msg is not None:
            if isinstance(msg, m.PromptBatch):
                self.queue.append(msg)
            msg = self.link.recv(0)

    def _ensure_version(self, min_version: int) -> bool:
        """Apply the trainer's newest version when one was announced (or, on joining, when
        the hub says the trainer is ahead of us), then check the batch's `min_version`."""
        self.weights.update()
        if self.weights.ready_for(min_version):
            return True
        self._receive(timeout_ms=20)  # let the trainer publish
        return False

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
        self.counters.add(prompts, tokens, seconds, batches)
        self.link.generator_stats = self.counters.stats(self.engine.version)
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
