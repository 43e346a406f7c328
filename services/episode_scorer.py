"""The scorer of an episode run: pull episode groups with credits, replay each group's
policy turns against fresh environments in worker processes (`grpo_stream.envs.replay`),
send what the environment answered (`EpisodeScored`).

Invariants: the environment runs in this scorer's sandbox (`EnvPool`: a timeout per call, a
memory limit, a worker in doubt replaced), never in the generator whose episodes it judges;
an environment that fails fails its episode (NaN, the error sent), and the scorer keeps
serving.
"""

from __future__ import annotations

import structlog

from grpo_stream.envs.replay import replay
from grpo_stream.envs.sandbox import EnvPool
from grpo_stream.protocols.episodes import EpisodeScoreRequest
from grpo_stream.session.service import Session

log = structlog.get_logger()


def serve_episodes(link: Session) -> int:
    cfg = link.cfg
    scored = 0
    with EnvPool(cfg.env) as pool:
        log.info("scorer.ready", env=cfg.env.name, workers=cfg.env.workers, replays=True)
        link.pull(cfg.scorer.groups_per_request)
        while not link.stop.set:
            msg = link.recv(timeout_ms=50)
            if not isinstance(msg, EpisodeScoreRequest):
                continue
            answer = replay(pool, msg)
            failed = [e for e in answer.errors if e]
            if failed:
                log.warning("scorer.episode_failed", group_id=msg.group_id, errors=failed[:3])
            link.send(answer)
            scored += 1
            link.stats.update(groups_scored=scored, env_worker_restarts=pool.restarts)
            link.replenish(1)
    return 0
