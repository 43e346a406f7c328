"""The scorer service: pull score requests with credits, run the task's weighted reward
functions in worker processes, send Scored.

Groups are scored as they arrive, several at once (the pool sends each group to one worker
while groups keep the workers busy) and each Scored goes out as soon as its group is done.
The heartbeat's ScorerStats carry what scoring cost (CPU seconds of the scorer and its
workers, completions scored): the hub turns them into metrics.jsonl's
`scorer_cpu_s_per_completion`.

Invariants: a reward call that raises, hangs, exceeds its memory limit or kills its worker
yields NaN for that completion plus an error event (once per distinct error, with its
traceback: `rewards.failures`); the scorer keeps serving. Under
hub.payloads = "direct" the scorer fetches the completions from their generator and checks
them as the hub checks Rollouts it carries (`hub.content`: ids in the vocabulary, the leased
prompt's ids, texts that are the ids' decoding) before scoring: what it scores is what the
trainer trains; a payload that fails is refused (`PayloadLost`, code "refused", one error
event) and the hub generates the group again.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

import numpy as np
import structlog

from grpo_stream.hub.content import ContentCheck
from grpo_stream.hub.payloads.refs import score_request_of
from grpo_stream.hub.payloads.store import PayloadFetcher, PayloadRef
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.payloads import PayloadLost, ScoreRef
from grpo_stream.rewards import reward_specs
from grpo_stream.rewards.calls import ScoreResult
from grpo_stream.rewards.sandbox import RewardPool
from grpo_stream.rewards.sizing import LEARNED, resolve_workers
from grpo_stream.services.episode_scorer import serve_episodes
from grpo_stream.session.service import Join, Session, run_service
from grpo_stream.tasks import make_task
from grpo_stream.threads import local_cores

log = structlog.get_logger()

IDLE_MS = 50
"""How long the scorer waits for a message when it scores nothing (its stop flag's latency)."""
BUSY_WAIT_S = 0.01
"""How long it waits for its reward workers at a time while it scores (a new message's
latency then)."""


class Link(Protocol):
    """What `_fetched` tells the hub through (the scorer's Session)."""

    def send(self, msg: m.Message) -> None: ...
    def replenish(self, credits: int) -> None: ...


def serve_scorer(link: Session) -> int:
    cfg = link.cfg
    if cfg.env.enabled:  # an episode run: the scorer replays episodes in their environment
        return serve_episodes(link)
    task = make_task(cfg.task)
    specs = reward_specs(cfg.task, task)
    learned = any(spec.name in LEARNED for spec in specs)
    cores = len(local_cores())
    workers = resolve_workers(
        cfg.scorer.workers, cfg.scorer.groups_per_request, os.environ, cores, learned
    )
    with RewardPool(specs, workers, cfg.scorer.timeout_s, cfg.scorer.memory_limit_mb) as pool:
        log.info("scorer.ready", rewards=[s.name for s in specs], workers=workers)
        link.pull(cfg.scorer.groups_per_request)
        fetcher = None  # hub.payloads = "direct": the completions are fetched from generators
        content = None  # ... and checked here, as the hub checks those it carries
        if cfg.hub.payloads == "direct":
            timeout_s = cfg.transport.io_timeout_ms / 1000
            fetcher = PayloadFetcher(link.ctx, cfg.transport, link.security, "scorer", timeout_s)
            content = ContentCheck.load(cfg, task) if cfg.security.check_content else None
        usage = Usage(pool, workers)
        scored = 0
        leases: dict[int, m.ScoreRequest] = {}  # by the pool's ticket
        while not link.stop.set:
            msg = link.recv(timeout_ms=0 if pool.busy() else IDLE_MS)
            if isinstance(msg, ScoreRef) and fetcher is not None:
                msg = _fetched(fetcher, msg, cfg.generator.group_size, link, content)
            if isinstance(msg, m.ScoreRequest):
                ticket = pool.submit(msg.prompt, list(msg.completions), dict(msg.reference))
                leases[ticket] = msg
            if not pool.busy():
                continue
            for ticket, result in pool.collect(0.0 if msg is not None else BUSY_WAIT_S):
                link.send(_scored(leases.pop(ticket), result))
                link.replenish(1)
                scored += 1
            link.scorer_stats = usage.stats(scored)
            link.stats.update(groups_scored=scored, **_display(pool))
    if fetcher is not None:
        fetcher.close()
    return 0


class Usage:
    """What scoring has cost: the scorer's CPU time (its process and its reward workers since
    they loaded), per completion in the heartbeat's ScorerStats."""

    def __init__(self, pool: RewardPool, workers: int) -> None:
        self.pool = pool
        self.workers = workers
        self._cpu_at_start = time.process_time()

    def stats(self, groups: int) -> m.ScorerStats:
        own = time.process_time() - self._cpu_at_start
        return m.ScorerStats(
            cpu_s=own + self.pool.cpu_s(),
            completions=self.pool.completions,
            groups=groups,
            calls=int(self.pool.stats()["calls"]),
            workers=self.workers,
        )


def _scored(request: m.ScoreRequest, result: ScoreResult) -> m.Scored:
    return m.Scored(
        lease_id=request.lease_id,
        group_id=request.group_id,
        rewards=np.asarray(result.rewards, dtype=np.float32),
        component_names=list(result.component_names),
        components=np.asarray(result.components, dtype=np.float32),
        errors=list(result.errors),
    )


def _display(pool: RewardPool) -> dict[str, int | float]:
    """The pool's counters for `grpo-stream status` (display only)."""
    stats = pool.stats()
    shown = {k: v for k, v in stats.items() if isinstance(v, (int, float))}
    return {**shown, **{f"failed_{k}": v for k, v in stats["failures"].items()}}


def _fetched(
    fetcher: PayloadFetcher,
    ref: ScoreRef,
    group_size: int,
    link: Link,
    content: ContentCheck | None = None,
) -> m.ScoreRequest | None:
    """The ScoreRequest of `ref` with the texts fetched from its generator; None after
    telling the hub it could not be fetched or `content` refused it (the group is generated
    again)."""
    got = fetcher.fetch([PayloadRef(ref.group_id, ref.source, ref.digest)]).get(
        ref.group_id, "unreachable"
    )
    why = None if content is None or isinstance(got, str) else content.check(got, got.instance)
    if why is not None:
        log.error("scorer.refused_content", group_id=ref.group_id, source=ref.source, reason=why)
        lost = PayloadLost(group_ids=[ref.group_id], reason=f"scorer: {why}", codes=["refused"])
        link.send(lost)
        link.replenish(1)
        return None
    request = score_request_of(ref, got, group_size)
    if isinstance(request, PayloadLost):
        log.error("payloads.fetch_failed", group_id=ref.group_id, code=request.codes[0],
                  source=ref.source)  # fmt: skip
        link.send(request)
        link.replenish(1)
        return None
    return request


def run_scorer(join: Join) -> int:
    return run_service(join, serve_scorer, heavy=False)
