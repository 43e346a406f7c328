"""No silent stalls: the hub says why the trainer has received nothing, and may stop the run.

Every `run.stall_report_s` seconds without a batch served to the trainer, `check` logs one
`hub.stall` warning naming the most likely cause and the setting to change, diagnosed from
the hub's own state in this order: a service kind not connected; every group scored since
the last batch filtered as zero-signal (with the reward distribution); groups failing to
score; the trainer not asking; scorers busy; teachers busy; the staleness gate closed;
generators working or idle. After `run.stall_abort_s` (off by default) `check` raises
`StallAbort` with that reason, which stops the hub with `grpo_stream.exits.EXIT_ABORTED`
(`up` does not restart it).

Progress is a step served: the ledger's `trained` count or the trainer version the hub
serves moving on. The clock runs from the trainer's first request after the last step served
(so a model load or a long step is not a stall); before the trainer ever asks, from the
hub's start (reported as "the trainer has not asked"). While every connected generator is
still loading its model (it has not yet sent the counters it reports from the moment its
engine is built: `Peer.generator` is None) the clock holds too: the generators say they are
loading (`model.load.progress`), and a normal load never reads as a stall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import structlog

from grpo_stream.config import RunConfig, RunSettings
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.registry import Registry
from grpo_stream.hub.replay import ReplayBuffer
from grpo_stream.hub.serving import BatchDesk

log = structlog.get_logger()


class Hub(Protocol):
    """What the watchdog reads of the hub (`grpo_stream.services.grouper.Grouper`)."""

    cfg: RunConfig
    ledger: Ledger
    desk: BatchDesk
    registry: Registry
    buffer: ReplayBuffer

    @property
    def scorers_needed(self) -> bool:
        """Whether groups wait for scorers (not for episodes their generators reward)."""

    @property
    def window_rewards(self) -> list[float]:
        """Rewards of the groups filtered as zero-signal since the last step served."""


class StallAbort(RuntimeError):
    """The trainer received nothing for `run.stall_abort_s`; the message says why."""


@dataclass(frozen=True)
class Mark:
    """The hub's counters at the last step served."""

    t: float
    trained: int
    version: int
    filtered: int
    failed: int


class Watchdog:
    """Watches one hub; `check(now, hub)` is called from the hub's loop on every tick."""

    def __init__(self, run: RunSettings, now: float) -> None:
        self.report_s = run.stall_report_s
        self.abort_s = run.stall_abort_s
        self.mark = Mark(now, 0, 0, 0, 0)
        self.since = now  # when the current wait began
        self.asked = False  # the trainer has asked since the last step served
        self.next_report = now + self.report_s
        self.reports = 0

    def check(self, now: float, hub: Hub) -> None:
        """Report a stall when one is due; raise StallAbort past the abort deadline."""
        counters = hub.ledger.counters
        trained, version = int(counters["trained"]), hub.ledger.versions.next_version
        if (trained, version) != (self.mark.trained, self.mark.version):
            self.mark = Mark(now, trained, version, counters["filtered"], counters["failed"])
            self._restart(now, asked=False)
            return
        if hub.desk.pending and not self.asked:
            self._restart(now, asked=True)  # a model load or a long step is not a stall
        if loading(hub):
            self._restart(now, asked=self.asked)  # the generators' model load neither
        waited = now - self.since
        abort = self.abort_s is not None and waited >= self.abort_s
        if now < self.next_report and not abort:
            return
        self.next_report = now + self.report_s
        why = diagnose(hub, self.mark)
        self.reports += 1
        log.warning("hub.stall", seconds=round(waited), step=version, why=why)
        if abort:
            log.error("hub.stall_abort", seconds=round(waited))
            raise StallAbort(
                f"the trainer received nothing for {waited:.0f}s (run.stall_abort_s): {why}"
            )

    def _restart(self, now: float, asked: bool) -> None:
        self.since, self.asked = now, asked
        self.next_report = now + self.report_s


def loading(hub: Hub) -> bool:
    """Whether generators are connected and every one is still loading its model (none has
    reported its counters, which a generator starts sending once its engine is built)."""
    gens = hub.registry.of("generator")
    return bool(gens) and all(p.generator is None for p in gens)


def diagnose(hub: Hub, mark: Mark) -> str:
    """The most likely reason nothing reached the trainer since `mark`, with what to change."""
    for service, how in (
        ("trainer", "start one: grpo-stream run trainer --hub ADDR"),
        ("generator", "start one, or see its log: it may still be loading the model"),
        ("scorer", "start one: grpo-stream run scorer --hub ADDR"),
        ("teacher", "start one: grpo-stream run teacher --hub ADDR"),
    ):
        if service == "scorer" and not hub.scorers_needed:
            continue  # episodes their generators reward: no scorer runs
        if service == "teacher" and hub.cfg.algo.distill.teacher is None:
            continue  # no distillation: no teacher runs
        if not hub.registry.of(service):
            return f"no {service} connected ({how})"
    counters = hub.ledger.counters
    filtered = counters["filtered"] - mark.filtered
    failed = counters["failed"] - mark.failed
    fresh = hub.buffer.ready(hub.ledger.versions.is_stale)
    if filtered > 0 and fresh < hub.cfg.hub.groups_per_step:
        return zero_signal(filtered, failed, hub.window_rewards)
    if failed > 0:
        return (
            f"{failed} groups failed to score (every reward NaN: errors or timeouts, see the "
            "reward.error events): fix the reward, or raise scorer.timeout_s"
        )
    return _pipeline(hub, fresh)


def zero_signal(filtered: int, failed: int, rewards: list[float]) -> str:
    """All scored groups were filtered: their rewards say whether the task is too hard."""
    values = np.array(rewards, dtype=np.float64)
    dist = (
        f"rewards mean {values.mean():.2f}, min {values.min():.2f}, max {values.max():.2f} over "
        f"{values.size} completions"
        if values.size
        else "no rewards recorded"
    )
    lost = f", {failed} failed" if failed else ""
    return (
        f"all {filtered} groups scored were filtered as zero-signal{lost} (every completion of "
        f"a group got the same reward; {dist}): the model cannot solve this task as set up: "
        "make it easier (task.*), give it room (generator.max_tokens), or train on them "
        "anyway (algo.advantage.filter_zero_signal = false)"
    )


def _pipeline(hub: Hub, fresh: int) -> str:
    """Nothing filtered or failed: where the groups wait."""
    ledger, need = hub.ledger, hub.cfg.hub.groups_per_step
    if not hub.desk.pending:
        return "the trainer has not asked for a batch (busy with a step, or loading)"
    scorers = hub.registry.of("scorer")
    if ledger.to_score and not any(p.credits > 0 for p in scorers):
        return (
            f"{len(ledger.to_score)} groups wait for a scorer, all busy: raise scorer.count "
            "or scorer.workers"
        )
    teachers = hub.registry.of("teacher")
    if ledger.to_teach and not any(p.credits > 0 for p in teachers):
        return (
            f"{len(ledger.to_teach)} groups wait for a teacher, all busy: raise teacher.count "
            "(or give the teacher a GPU: teacher.device)"
        )
    held = sum(ledger.leases.held_by().values())
    if held:
        return (
            f"generators are working on {held} groups ({fresh} of {need} ready): generation "
            "is slow (generator.max_tokens, generator.count)"
        )
    gens = hub.registry.of("generator")
    if ledger.pipeline().capacity() == 0 and not ledger.retry:
        return (
            f"the staleness gate is closed (hub.max_staleness = {hub.cfg.hub.max_staleness}): "
            f"new prompts wait for weight version {ledger.versions.next_version + 1}"
        )
    if not any(p.credits > 0 for p in gens):
        return (
            "generators are idle and asked for no work (waiting for a weight version? see "
            "their logs)"
        )
    return f"{fresh} of {need} groups ready (hub.groups_per_step)"
