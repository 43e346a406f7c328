"""The scorer service: pull score requests with credits, run the task's weighted reward
functions in worker processes, send Scored.

Invariants: a reward call that raises, hangs, exceeds its memory limit or kills its worker
yields NaN for that completion plus an error event; the scorer keeps serving. Under
hub.payloads = "direct" the scorer fetches the completions from their generator and checks
them as the hub checks Rollouts it carries (`hub.content`: ids in the vocabulary, the leased
prompt's ids, texts that are the ids' decoding) before scoring: what it scores is what the
trainer trains; a payload that fails is refused (`PayloadLost`, code "refused", one error
event) and the hub generates the group again.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import structlog

from grpo_stream.hub.content import ContentCheck
from grpo_stream.hub.payloads.refs import score_request_of
from grpo_stream.hub.payloads.store import PayloadFetcher, PayloadRef
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.payloads import PayloadLost, ScoreRef
from grpo_stream.ratelimit import RateLimit
from grpo_stream.rewards import reward_specs
from grpo_stream.rewards.sandbox import RewardPool
from grpo_stream.session.service import Join, Session, run_service
from grpo_stream.tasks import make_task

log = structlog.get_logger()


class Link(Protocol):
    """What `_fetched` tells the hub through (the scorer's Session)."""

    def send(self, msg: m.Message) -> None: ...
    def replenish(self, credits: int) -> None: ...


def serve_scorer(link: Session) -> int:
    cfg = link.cfg
    task = make_task(cfg.task)
    specs = reward_specs(cfg.task, task)
    scored = 0
    warn = RateLimit()
    with RewardPool(
        specs, cfg.scorer.workers, cfg.scorer.timeout_s, cfg.scorer.memory_limit_mb
    ) as pool:
        log.info("scorer.ready", rewards=[s.name for s in specs], workers=cfg.scorer.workers)
        link.pull(cfg.scorer.groups_per_request)
        fetcher = None  # hub.payloads = "direct": the completions are fetched from generators
        content = None  # ... and checked here, as the hub checks those it carries
        if cfg.hub.payloads == "direct":
            timeout_s = cfg.transport.io_timeout_ms / 1000
            fetcher = PayloadFetcher(link.ctx, cfg.transport, link.security, "scorer", timeout_s)
            content = ContentCheck.load(cfg, task) if cfg.security.check_content else None
        while not link.stop.set:
            msg = link.recv(timeout_ms=50)
            if isinstance(msg, ScoreRef) and fetcher is not None:
                msg = _fetched(fetcher, msg, cfg.generator.group_size, link, content)
            if not isinstance(msg, m.ScoreRequest):
                continue
            result = pool.score(msg.prompt, list(msg.completions), dict(msg.reference))
            for err in result.errors:
                count = warn.allow("reward.failed")
                if count is not None:
                    log.warning("reward.failed", group_id=msg.group_id, error=err, count=count)
            link.send(
                m.Scored(
                    lease_id=msg.lease_id,
                    group_id=msg.group_id,
                    rewards=np.asarray(result.rewards, dtype=np.float32),
                    component_names=list(result.component_names),
                    components=np.asarray(result.components, dtype=np.float32),
                    errors=list(result.errors),
                )
            )
            scored += 1
            stats = pool.stats()
            link.stats.update(
                groups_scored=scored,
                **{k: v for k, v in stats.items() if isinstance(v, (int, float))},
                **{f"failed_{k}": v for k, v in stats["failures"].items()},
            )
            link.replenish(1)
    if fetcher is not None:
        fetcher.close()
    return 0


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
