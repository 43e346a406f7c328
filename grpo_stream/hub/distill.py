"""The hub's side of on-policy distillation: scored groups wait for a teacher's log-probs, then
enter the replay buffer with per-token advantages (`grpo_stream.algo.distill`).

A scored group that would be buffered is held here instead (ledger stage `to_teach`); the
dispatcher leases it to a teacher with credits (`request`); the teacher's `Taught` turns it
into token advantages and hands it to the buffer (`on_taught`).

Invariants: a group reaches the buffer once, with its teacher's log-probs (a duplicate or
late Taught is dropped and counted by the ledger); a Taught whose log-probs do not match the
group's tokens (count, finite, at most 0) changes nothing and is refused; a teacher that
could not score a group (`error`) ends it as failed, never trained without its teacher;
a lost or late teacher's groups go back to the queue (the ledger's `teach` leases).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import structlog

from grpo_stream.algo.distill import mean_reverse_kl, token_advantages
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.distill import Taught, TeachRequest
from grpo_stream.ratelimit import RateLimit

log = structlog.get_logger()

LOGPROB_SLACK = 1e-3
"""A log-prob may exceed 0 by this much (rounding of a near-certain token), no more."""


def check_taught(msg: Taught, group: Group | None) -> str | None:
    """Why `msg` cannot be the log-probs of `group` (None: it can, or no group awaits it)."""
    if group is None or msg.error:
        return None
    lp = np.asarray(msg.logprobs)
    if lp.shape != (group.num_tokens,):
        return f"taught group {msg.group_id}: {lp.size} log-probs for {group.num_tokens} tokens"
    if not np.all(np.isfinite(lp)) or np.any(lp > LOGPROB_SLACK):
        return f"taught group {msg.group_id}: log-probs must be finite and at most 0"
    return None


class Teaching:
    """Groups waiting for their teacher, by group id."""

    def __init__(self, weight: float, ledger: Ledger, to_buffer: Callable[[Group], None]) -> None:
        self.weight = weight
        self.ledger = ledger
        self.to_buffer = to_buffer  # the hub's: add to the replay buffer, count evictions
        self.groups: dict[int, Group] = {}
        self._warn = RateLimit()

    def hold(self, group: Group) -> None:
        """A scored group waits for a teacher (the ledger's `to_teach`)."""
        self.ledger.await_teacher(group.group_id)
        self.groups[group.group_id] = group

    def request(self, lease_id: int, group_id: int) -> TeachRequest:
        g = self.groups[group_id]
        return TeachRequest(
            lease_id=lease_id,
            group_id=group_id,
            prompt_ids=g.prompt_ids,
            completion_ids=g.completion_ids,
            completion_offsets=g.completion_offsets,
            temperature=g.sampling.temperature,
        )

    def on_taught(self, msg: Taught) -> None:
        """A teacher's answer (already checked by `check_taught`)."""
        if not self.ledger.accept_taught(msg.group_id):  # a duplicate: counted there
            return
        group = self.groups.pop(msg.group_id)
        if msg.error:
            self.ledger.counters["teacher_failed"] += 1
            self.ledger.finish(msg.group_id, "failed")
            count = self._warn.allow("teacher.failed")
            if count is not None:
                log.warning("teacher.failed", group_id=msg.group_id, error=msg.error, count=count)
            return
        teacher = np.asarray(msg.logprobs, dtype=np.float32)
        group.token_advantages = token_advantages(
            teacher,
            group.logprobs,
            group.completion_offsets,
            group.advantages,
            group.valid,
            self.weight,
        )
        group.distill_kl = mean_reverse_kl(teacher, group.logprobs)
        self.to_buffer(group)


def step_kl(groups: list[Group]) -> float:
    """The mean reverse KL from the teacher of a step's taught groups (NaN: none taught)."""
    kls = [g.distill_kl for g in groups if np.isfinite(g.distill_kl)]
    return float(np.mean(kls)) if kls else float("nan")
