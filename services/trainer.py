"""The trainer service: request TrainBatches, apply the regularized GRPO update, publish
weights, write metrics and checkpoints.

Invariants:
- the policy version grows by one per optimizer step applied, and by one per rollback that
  restored older weights (each publishes those weights as a new version); it is unique
  forever: each is recorded (`grpo_stream.training.versions`) before it is announced, and a
  trainer resumed from a checkpoint older than the newest announced version continues above
  it by more than `hub.max_staleness`, so the discarded timeline's rollouts are stale;
- a version is published (complete snapshot, then announce) before a batch request that
  names it reaches the hub, so the hub never asks generators for a version that will not come;
- a non-finite loss, gradient or norm, or an exploding norm, never reaches the weights
  (rollback of the GRPO core);
- a batch with a token id outside the model's vocabulary is never trained: the trainer stops
  with one error line (`BatchRefused`), and the hub serves that step new groups once the
  trainer died on it `security.batch_crash_limit` times;
- after every step, the hub gets the step's evidence on each group (its log-prob gap:
  `RolloutEvidence`, for verified rollouts);
- under context parallelism only each group's leader asks the hub for batches (as data
  rank `data_rank` of `data_ranks`) and sends evidence; it shares each batch with its group
  (`training.context.groups.share_batch`), and its stopping stops the group.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from grpo_stream.config import RunConfig
from grpo_stream.exits import EXIT_HUB_GONE
from grpo_stream.hub.payloads.refs import fetch_batch
from grpo_stream.hub.payloads.store import PayloadFetcher
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.payloads import TrainBatchRef
from grpo_stream.session.service import Join, Session, run_service
from grpo_stream.training.device import release_cache
from grpo_stream.training.evidence import group_evidence
from grpo_stream.training.metrics import MetricsWriter, hub_columns
from grpo_stream.training.samples import CompletionLog, batch_samples
from grpo_stream.training.sinks import Sink, make_sinks
from grpo_stream.training.versions import VersionMark, resumed_version
from grpo_stream.transport.weights import WeightServer

log = structlog.get_logger()


class BatchRefused(RuntimeError):
    """A TrainBatch that must not be trained (the hub's checks should have refused it)."""


class Trainer:
    """Policy, optimizer and the update loop of one trainer process (rank 0 publishes).

    Under FSDP2 `publish` and `state.checkpoint` are collective: every rank reaches them at
    the same steps (same step counter, same publish/checkpoint intervals), only rank 0 writes.
    """

    def __init__(self, link: Session, resume: bool) -> None:
        from grpo_stream.training.state import TrainState

        self.link = link
        self.stop = link.stop
        self.run_dir = Path(self.cfg.run.run_dir)
        self.state = TrainState.create(self.cfg, resume=resume)
        self.versions = VersionMark(self.run_dir)
        if resume:
            self._continue_versions()
        self.server: Any = None
        self.metrics: Any = None
        self.sinks: list[Sink] = []
        run = self.cfg.run  # rank 0 writes them (with the metrics)
        self.samples = CompletionLog(self.run_dir, run.log_completions, run.log_completions_prompts)
        self.wall0 = time.time()
        self.wait_total = 0.0
        self.attempt = 0  # times the current step was skipped (BatchRequest.attempt)
        self._reporter: subprocess.Popen[bytes] | None = None
        self._next_report = time.monotonic() + 30.0
        self._asked: float | None = None  # when the outstanding BatchRequest went out
        self._fetcher: Any = None  # hub.payloads = "direct": a PayloadFetcher, made at need
        link.on_rejoin(self._rejoined)

    @property
    def cfg(self) -> RunConfig:
        return self.link.cfg

    def _continue_versions(self) -> None:
        mark = self.versions.highest()
        version = resumed_version(self.state.version, mark, self.cfg.hub.max_staleness)
        if version != self.state.version:
            log.warning(
                "trainer.versions_continued",
                checkpoint_version=self.state.version,
                announced_up_to=mark,
                version=version,
            )
            self.state.version = version

    def start(self) -> None:
        """Rank 0: bind the weight server, publish the current version, tell the hub where
        it is, open metrics. Other ranks only train (and join publishing under FSDP2)."""
        if self.state.rank != 0:
            self.publish()  # under FSDP2, rank 0's first publish gathers from every rank
            return

        host = _host_of(self.cfg.trainer.bind)
        self.server = WeightServer(
            self.link.ctx,
            self.cfg.trainer.bind,
            self.cfg.trainer.announce_bind or f"tcp://{host}:0",
            self.cfg.transport,
            self.link.security,
            self.cfg.weights,
            secret=self.link.secret,
        )
        self.publish()
        public = self.cfg.trainer.public_host
        addresses = self.server.addresses
        endpoints = m.Endpoints(
            weights=_public(addresses["weights"], public),
            announce=_public(addresses["announce"], public),
        )
        self.link.endpoints = endpoints
        self.link.introduce()  # second Hello, now with the weight server's endpoints
        self.metrics = MetricsWriter(self.run_dir)
        self.sinks = make_sinks(
            list(self.cfg.run.sinks), self.run_dir, self.cfg.model_dump(mode="json")
        )
        log.info(
            "trainer.ready",
            version=self.state.version,
            step=self.state.step,
            weights=endpoints.weights,
            announce=endpoints.announce,
        )

    def publish(self) -> None:
        """Rank 0 sends the current version. Every rank calls this at the same points: under
        FSDP2 the full weights are gathered from all ranks first."""
        if self.server is None and not self.state.fsdp:
            return
        t0 = time.perf_counter()
        weights = self.state.named_weights()  # collective under FSDP2
        if self.server is None:
            return
        self.versions.record(self.state.version)  # durable before anyone hears of it
        self.server.publish(self.state.version, weights)
        log.info(
            "weights.published",
            version=self.state.version,
            seconds=round(time.perf_counter() - t0, 4),
        )

    def serve(self) -> bool:
        """Train until max_steps (True) or a stop request (False)."""
        ctx = self.state.context
        while self.state.step < self.cfg.run.max_steps and (ctx is not None or not self.stop.set):
            batch, waited = self._group_batch()
            if batch is None:
                break
            self.wait_total += waited
            self._check(batch)
            t0 = time.perf_counter()
            result = self.state.train_step(batch)
            seconds = time.perf_counter() - t0
            if ctx is None or ctx.leads:  # a context group's ranks hold the same groups
                self.link.send(group_evidence(self.state.meter.rows, batch))
            if not result.applied:
                self.attempt += 1  # a new attempt at this step: the hub sends new groups
                if result.republish:  # a rollback restored older weights as a new version
                    self.publish()
                continue
            self.attempt = 0
            log.info("batch.trained", step=batch.step, groups=[int(g) for g in batch.group_ids])
            if self.cfg.trainer.throttle_s:
                time.sleep(self.cfg.trainer.throttle_s)  # test hook: a slow trainer
            if self.state.version % self.cfg.trainer.publish_every == 0:
                self.publish()
            release_cache(self.state.device, self.cfg.run.placement == "colocated")
            if self.metrics is not None:
                self._record(batch, result.metrics, seconds, waited)
                if self.samples.due(self.state.step):
                    self._show_samples(batch)
            if self.state.step % self.cfg.trainer.checkpoint_every == 0:
                self.state.checkpoint()
        return self.state.step >= self.cfg.run.max_steps

    def _check(self, batch: m.TrainBatch) -> None:
        """Raise BatchRefused for token ids outside the vocabulary (they would crash the
        forward, on a GPU without a readable error)."""
        ids = np.asarray(batch.input_ids)
        vocab = self.state.vocab_size()
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise BatchRefused(
                f"step {batch.step}: token id {int(ids.max())} (min {int(ids.min())}) outside "
                f"the vocabulary [0, {vocab}): groups {[int(g) for g in batch.group_ids]}"
            )

    def _group_batch(self) -> tuple[m.TrainBatch | None, float]:
        """This step's batch: the hub's (`_next_batch`), or under context parallelism the
        group leader's, shared with its group (None on every rank when the leader stops)."""
        ctx = self.state.context
        if ctx is None:
            return self._next_batch()
        from grpo_stream.training.context.groups import share_batch  # torch: late

        t0 = time.perf_counter()
        batch = self._next_batch()[0] if ctx.leads and not self.stop.set else None
        batch = share_batch(ctx, batch, lambda: self.link.recv(timeout_ms=50))
        return batch, time.perf_counter() - t0

    def _next_batch(self) -> tuple[m.TrainBatch | None, float]:
        """Ask for this step's batch; ask again (the same request: the hub answers it with
        the same batch) when the hub restarted or nothing came within a heartbeat deadline."""
        t0 = time.perf_counter()
        self._ask()
        try:
            while not self.stop.set:
                msg = self.link.recv(timeout_ms=100)
                if isinstance(msg, TrainBatchRef) and msg.step == self.state.step:
                    msg = self._fetch(msg)  # hub.payloads = "direct"
                if isinstance(msg, m.TrainBatch) and msg.step == self.state.step:
                    return msg, time.perf_counter() - t0
                if isinstance(msg, m.TrainBatch):  # an answer to an earlier, repeated request
                    log.warning("batch.discarded", step=msg.step, expected=self.state.step)
                asked = self._asked or 0.0
                if time.monotonic() - asked > self.cfg.transport.heartbeat_timeout_s:
                    log.info("batch.reasked", step=self.state.step, rejoined=False)
                    self._ask()  # the batch got lost
            return None, time.perf_counter() - t0
        finally:
            self._asked = None

    def _fetch(self, ref: TrainBatchRef) -> m.TrainBatch | None:
        """The batch of `ref`, its groups fetched from their generators; None after telling
        the hub which could not be fetched and asking again (the hub serves the step anew)."""
        if self._fetcher is None:
            timeout_s = self.cfg.transport.io_timeout_ms / 1000
            self._fetcher = PayloadFetcher(
                self.link.ctx, self.cfg.transport, self.link.security, "trainer", timeout_s
            )
        got = fetch_batch(self._fetcher, ref, self.state.version, self.attempt)
        if isinstance(got, m.TrainBatch):
            return got
        log.error("payloads.fetch_failed", step=ref.step, groups=got.group_ids, codes=got.codes)
        self.link.send(got)
        self._ask()
        return None

    def _ask(self) -> None:
        self.link.send(self._request())
        self._asked = time.monotonic()

    def _rejoined(self) -> None:
        """The hub (re)registered us and forgot the request: ask again, if one is out."""
        if self._asked is not None:
            log.info("batch.reasked", step=self.state.step, rejoined=True)
            self._ask()

    def _show_samples(self, batch: m.TrainBatch) -> None:
        prompts = self.samples.prompts
        samples = batch_samples(batch, self.state.tokenizer, self.state.step, prompts)
        self.samples.write(samples, self.sinks)
        best = max(samples, key=lambda s: s.reward, default=None)
        if best is not None:
            log.info(
                "trainer.samples",
                step=self.state.step,
                prompt=best.prompt,
                completion=best.completion,
                reward=_r(best.reward),
                shown=len(samples),
                file=str(self.samples.path),
            )

    def _record(
        self, batch: m.TrainBatch, metrics: dict[str, Any], seconds: float, waited: float
    ) -> None:
        row = {
            "step": self.state.step,
            **hub_columns(batch.stats),
            **metrics,
            "policy_version": self.state.version,
            "sequences": len(batch.advantages),
            "tokens": len(batch.behaviour_logprobs),
            "trainer_wait_s": waited,
            "trainer_wait_total_s": self.wait_total,
            "step_seconds": seconds,
            "wall_time": time.time() - self.wall0,
        }
        self.metrics.write(row)
        for sink in self.sinks:
            sink.write(self.state.step, row)
        log.info(
            "trainer.step",
            step=self.state.step,
            reward=_r(row["reward_mean"]),
            loss=_r(row.get("loss")),
            kl=_r(row.get("kl")),
            grad_norm=_r(row.get("grad_norm")),
            tau=_r(row.get("tau")),
            wait_s=_r(waited),
            step_s=_r(seconds),
            staleness=_r(row["staleness_mean"]),
        )
        if time.monotonic() >= self._next_report:  # a report costs CPU: every 30 s at most
            self._next_report = time.monotonic() + 30.0
            self._report(background=True)

    def _report(self, background: bool = False) -> None:
        """Render report.png in a child process (matplotlib's memory and CPU stay out of the
        trainer); in the background during the run, waited for at the end."""
        if self._reporter is not None and self._reporter.poll() is None:
            if background:
                return  # the previous one is still drawing
            self._reporter.wait()
        self._reporter = subprocess.Popen(
            [sys.executable, "-m", "grpo_stream.report", str(self.run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        if not background and self._reporter.wait() != 0:
            log.warning("report.failed", code=self._reporter.returncode)

    def _request(self) -> m.BatchRequest:
        st, ctx = self.state, self.state.context
        return m.BatchRequest(
            step=st.step,
            trainer_version=st.version,
            rank=st.rank if ctx is None else ctx.data_rank,
            world_size=st.world_size if ctx is None else ctx.data_ranks,
            attempt=self.attempt,
        )

    def close(self, completed: bool) -> None:
        # a step that is a multiple of checkpoint_every was written by the loop (or resumed
        # from): the same rule on every rank, so collective checkpoints stay in step
        written = self.state.step > 0 and self.state.step % self.cfg.trainer.checkpoint_every == 0
        if (self.state.step > 0 or completed) and not written:
            self.state.checkpoint()
        for sink in self.sinks:
            sink.close()
        if self.metrics is not None:
            self.metrics.close()
            self._report()
        if self.server is not None:
            self.server.close()
        if self._fetcher is not None:
            self._fetcher.close()


def _r(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def _host_of(address: str) -> str:
    return address.split("://", 1)[1].rsplit(":", 1)[0]


def _public(address: str, host: str | None) -> str:
    if host is None:
        return address
    return f"tcp://{host}:{address.rsplit(':', 1)[1]}"


def run_trainer(join: Join, resume: bool = False) -> int:
    rank = int(os.environ.get("RANK", "0"))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        join = dataclasses.replace(join, instance=f"{join.instance}-r{rank}")
    join = dataclasses.replace(join, rank=rank)
    return run_service(join, lambda session: serve_trainer(session, resume))


def serve_trainer(session: Session, resume: bool = False) -> int:
    """Train until max_steps or a stop request; 0, or `EXIT_HUB_GONE` when the hub went away
    before the end (`up` restarts the trainer then)."""
    stop = session.stop
    trainer = Trainer(session, resume=resume)
    completed = False
    try:
        trainer.start()
        completed = trainer.serve()
    finally:
        trainer.close(completed)
        session.farewell = "done" if completed else (stop.reason or "stopped")
    log.info("trainer.finished", completed=completed, step=trainer.state.step)
    if completed or not stop.reason.startswith("hub"):
        return 0  # done, or stopped by a signal (a final checkpoint was written)
    return EXIT_HUB_GONE  # the hub went away before max_steps: not a clean end of the run
