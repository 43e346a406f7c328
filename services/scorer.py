"""The scorer service: pull score requests with credits, run the task's weighted reward
functions in worker processes, send Scored.

Invariant: a reward call that raises, hangs, exceeds its memory limit or kills its worker
yields NaN for that completion plus an error event; the scorer keeps serving.
"""

from __future__ import annotations

import numpy as np
import structlog

from grpo_stream.protocols import messages as m
from grpo_stream.ratelimit import RateLimit
from grpo_stream.runtime import HubLink, StopFlag
from grpo_stream.transport.settings import SecuritySettings, TransportSettings

log = structlog.get_logger()


def serve_scorer(link: HubLink, stop: StopFlag) -> None:
    from grpo_stream.rewards import reward_specs
    from grpo_stream.rewards.sandbox import RewardPool
    from grpo_stream.tasks import make_task

    assert link.cfg is not None
    cfg = link.cfg
    specs = reward_specs(cfg.task, make_task(cfg.task))
    credits = cfg.scorer.groups_per_request
    scored = 0
    joins = link.joins
    warn = RateLimit()
    with RewardPool(
        specs, cfg.scorer.workers, cfg.scorer.timeout_s, cfg.scorer.memory_limit_mb
    ) as pool:
        log.info("scorer.ready", rewards=[s.name for s in specs], workers=cfg.scorer.workers)
        link.send(m.WorkRequest(instance=link.instance, credits=credits))
        while not stop.set:
            msg = link.recv(timeout_ms=50)
            if link.joins != joins:  # the hub restarted: ask again
                joins = link.joins
                link.send(m.WorkRequest(instance=link.instance, credits=credits))
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
            link.stats.update(
                groups_scored=scored,
                **{k: v for k, v in pool.stats().items() if isinstance(v, (int, float))},
            )
            link.send(m.WorkRequest(instance=link.instance, credits=1))


def run_scorer(
    hub: str,
    instance: str,
    transport: TransportSettings,
    security: SecuritySettings,
    fingerprint: dict[str, object] | None = None,
    log_setup: tuple[str, bool] = ("info", False),
) -> int:
    stop = StopFlag().install()
    link = HubLink(
        "scorer",
        instance,
        hub,
        transport,
        security,
        stop,
        fingerprint=fingerprint,
        log_setup=log_setup,
    )
    link.connect()
    try:
        serve_scorer(link, stop)
    finally:
        link.close(stop.reason or "done")
    return 0
