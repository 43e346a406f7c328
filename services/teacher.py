"""The teacher service: pull groups with credits, score their completion tokens with the
teacher model, send Taught (on-policy distillation, `algo.distill.teacher`).

Invariant: every TeachRequest gets one Taught: the log-probs, or `error` naming why the
teacher could not score the group (too long for its context, a non-finite result, an
exception in the engine); the teacher keeps serving. A request it never answers (the process
died or stalled) goes to another teacher when its lease expires (`teacher.timeout_s`).
"""

from __future__ import annotations

import time

import numpy as np
import structlog

from grpo_stream.engines.distill import TeacherEngine, TeacherError, load_teacher
from grpo_stream.protocols.distill import Taught, TeachRequest
from grpo_stream.ratelimit import RateLimit
from grpo_stream.session.service import Join, Session, run_service

log = structlog.get_logger()


def answer(engine: TeacherEngine, request: TeachRequest) -> Taught:
    """The Taught for `request`: the teacher's log-probs, or the error that prevented them."""
    try:
        values = engine.logprobs(
            np.asarray(request.prompt_ids),
            np.asarray(request.completion_ids),
            np.asarray(request.completion_offsets),
            request.temperature,
        )
        return Taught(lease_id=request.lease_id, group_id=request.group_id, logprobs=values)
    except (TeacherError, ValueError, RuntimeError) as exc:  # the engine's, never ours to hide
        return Taught(
            lease_id=request.lease_id,
            group_id=request.group_id,
            logprobs=np.zeros(0, np.float32),
            error=f"{type(exc).__name__}: {exc}"[:300],
        )


def serve_teacher(link: Session) -> int:
    cfg = link.cfg
    path = cfg.algo.distill.teacher
    if path is None:  # started by hand on a run that does not distil
        log.warning("teacher.off", reason="algo.distill.teacher is not set: nothing to score")
        while not link.stop.set:
            link.recv(timeout_ms=200)
        return 0
    t = cfg.teacher
    engine = load_teacher(path, t.engine, t.dtype, t.device, t.gpu_memory_utilization)
    warn = RateLimit()
    taught = failed = 0
    busy = 0.0
    log.info("teacher.ready", model=path, engine=t.engine, credits=t.groups_per_request)
    link.pull(t.groups_per_request)
    try:
        while not link.stop.set:
            msg = link.recv(timeout_ms=50)
            if not isinstance(msg, TeachRequest):
                continue
            start = time.perf_counter()
            reply = answer(engine, msg)
            busy += time.perf_counter() - start
            link.send(reply)
            link.replenish(1)
            if reply.error:
                failed += 1
                if (count := warn.allow("teacher.error")) is not None:
                    log.warning(
                        "teacher.error", group_id=msg.group_id, error=reply.error, count=count
                    )
            else:
                taught += 1
            link.stats.update(groups_taught=taught, groups_failed=failed, busy_s=round(busy, 3))
    finally:
        engine.close()
    return 0


def run_teacher(join: Join) -> int:
    return run_service(join, serve_teacher)
