"""What the hub takes in from its workers, up to the replay buffer: Rollouts (or, with
hub.payloads = "direct", their announcements), Scored, EpisodeScored, Taught.

Each is checked (`guard`, the lease holder and quarantine in `TrustGate`) before the ledger
hears of it; a scored group gets its advantages (`hub.batches.assemble`) and then ends as
failed, is dropped as zero-signal (refilled), waits for its teacher, or enters the buffer.
Failed rewards are watched here: too many groups in a row, or too large a share of failed
episodes, aborts the run through the hub.

Invariants:
- a Rollout no honest sampler sends (impossible numbers, lengths that disagree, episode
  fields on a single-turn run or none on an episode run: the config alone says which) is
  refused as `bad_rollout` and counted against its generator (`TrustGate.bad_rollout`);
- rewards come from scorers: an episode group waits for a scorer's replay when the run's
  environment can be replayed (`transcripts`), and only otherwise is its generator's word
  taken (`scored_by_env`; the hub said so at its start).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable

import numpy as np
import structlog

from grpo_stream.algo.advantages import batch_window, stream_batch_std
from grpo_stream.algo.overlong import Overlong
from grpo_stream.config import RunConfig
from grpo_stream.hub import guard
from grpo_stream.hub.batches import assemble, failure_streak
from grpo_stream.hub.distill import Teaching, check_taught
from grpo_stream.hub.episodes import FailureAlarm, check_episode, check_kind, scored_by_env
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.payloads.direct import DirectPayloads
from grpo_stream.hub.registry import Peer
from grpo_stream.hub.replay import Group, ReplayBuffer
from grpo_stream.hub.transcript import Judged, Transcripts
from grpo_stream.hub.trust import TrustGate
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.distill import Taught
from grpo_stream.protocols.episodes import EpisodeScored
from grpo_stream.protocols.payloads import RolloutMeta
from grpo_stream.ratelimit import RateLimit

log = structlog.get_logger()

Refuse = Callable[[bytes, str, str, str], None]
"""The hub's answer to a message that fails a check: (identity, code, reason, kind)."""


class Intake:
    """The hub's handlers of finished work, and the rewards and failures they keep."""

    def __init__(
        self,
        cfg: RunConfig,
        ledger: Ledger,
        buffer: ReplayBuffer,
        trust: TrustGate,
        rollouts: dict[int, m.Rollout],
        direct: DirectPayloads | None,
        refuse: Refuse,
        abort: Callable[[str], None],
        transcripts: Transcripts | None = None,
    ) -> None:
        self.cfg = cfg
        self.episodes = cfg.env.enabled  # the config alone says whether rollouts are episodes
        self.transcripts = transcripts  # episodes a scorer replays (None: trust the generator)
        self.ledger = ledger
        self.buffer = buffer
        self.trust = trust
        self.rollouts = rollouts
        self.direct = direct
        self._refuse = refuse
        self._abort = abort
        self.recent_rewards: deque[float] = deque(  # scale="batch": one batch's rewards
            maxlen=batch_window(cfg.hub.groups_per_step, cfg.generator.group_size)
        )
        self.window_rewards: list[float] = []  # rewards of groups filtered since the last batch
        self.failure_alarm = FailureAlarm(cfg.env.alarm_failed_share, cfg.env.alarm_window)
        self._failed_in_row = 0  # groups in a row whose every reward failed
        self._warn = RateLimit()
        self.teaching: Teaching | None = None  # algo.distill.teacher: groups wait for it
        if cfg.algo.distill.teacher is not None:
            self.teaching = Teaching(cfg.algo.distill.weight, ledger, self.to_buffer)

    def impossible(self, msg: m.Rollout) -> str | None:
        """Why no honest sampler sends `msg` (None: one could)."""
        refused = guard.check_rollout(msg, self.cfg.generator.group_size)
        refused = refused or guard.check_numbers(msg) or check_kind(msg, self.episodes)
        if refused is None and self.episodes:
            refused = check_episode(msg)
        if refused is None and self.transcripts is not None:
            refused = self.transcripts.read(msg)  # its turns, kept for the scorer
        return refused

    def on_rollout(self, peer: Peer, msg: m.Rollout) -> None:
        if not self.trust.admit(peer, msg.KIND, self.trust.lease(peer, msg)):
            return  # another's lease, or a quarantined sender: before reading anything
        refused = self.impossible(msg)
        if refused is not None:
            self.trust.bad_rollout(peer, msg.KIND, refused)
            return
        if not self.trust.admit(peer, msg.KIND, self.trust.rollout(peer, msg)):
            return
        if not self.ledger.accept_rollout(msg.group_id):
            return
        self.trust.accepted(msg.group_id, peer)
        if self.ledger.versions.is_stale(msg.policy_version):  # the oldest token's (guard checked)
            self.ledger.finish(msg.group_id, "stale")
            return
        self.rollouts[msg.group_id] = msg
        if self.episodes and self.transcripts is None:  # its environment cannot be replayed:
            self._check_failures(msg)  # its generator's rewards (env.rewards_trusted)
            self._take_scored(scored_by_env(msg))

    def on_episode_scored(self, peer: Peer, msg: EpisodeScored) -> None:
        """A scorer's replay of an episode group: its rewards are the ones trained, once the
        generator's episodes agree with what the environment said."""
        rollout = self.rollouts.get(msg.group_id)
        transcripts = self.transcripts
        if transcripts is None:
            self._refuse(peer.identity, "unexpected_kind", "this run replays no episodes", msg.KIND)
            return
        held = self.trust.holder(peer, msg.lease_id, msg.group_id, "score")
        if not self.trust.admit(peer, msg.KIND, held):
            return
        if rollout is None:  # not awaited (a duplicate, or regenerated): counted, dropped
            self.ledger.accept_scored(msg.group_id)
            return
        judged = transcripts.judge(rollout, msg)
        if isinstance(judged, str):  # the generator's fault, not the scorer's: no Error to it
            self._lied(msg.group_id, judged)
            return
        transcripts.forget(msg.group_id)
        rollout = self._rewarded(rollout, judged)
        self.rollouts[msg.group_id] = rollout
        self._check_failures(rollout)
        scored = scored_by_env(rollout)
        scored.lease_id = msg.lease_id
        self._take_scored(scored)

    def _rewarded(self, rollout: m.Rollout, judged: Judged) -> m.Rollout:
        """`rollout` with the scorer's rewards in place of its generator's."""
        return dataclasses.replace(
            rollout,
            episode_rewards=judged.rewards,
            turn_rewards=judged.turn_rewards,
            errors=judged.errors,
        )

    def _lied(self, group_id: int, why: str) -> None:
        """The generator's episodes disagree with the environment: the group is generated
        again by another, and the lie counted against its generator."""
        generator = self.trust.verifier.generator_of(group_id)
        if self.ledger.regenerate(group_id):
            self.rollouts.pop(group_id, None)
        if self.transcripts is not None:
            self.transcripts.forget(group_id)
        if generator is not None:
            log.error("episode.refused", group_id=group_id, generator=generator, reason=why)
            self.trust.strike(generator, why)

    def _check_failures(self, msg: m.Rollout) -> None:
        """The run-level alarm on failed episodes: an error event, and the run stops when
        env.alarm_abort says so (never a silent degradation)."""
        alarm = self.failure_alarm.add(msg)
        if alarm is None:
            return
        log.error("env.failure_alarm", alarm=alarm, fired=self.failure_alarm.fired)
        if self.cfg.env.alarm_abort:
            self._abort(f"{alarm} (env.alarm_abort)")

    def on_scored(self, peer: Peer, msg: m.Scored) -> None:
        refused = guard.check_scored(msg, self.rollouts.get(msg.group_id))
        if refused is None and self.episodes and msg.group_id in self.rollouts:
            refused = "an episode group is scored by replaying it (episode_scored)"
        if refused is not None:
            self._refuse(peer.identity, "bad_scored", refused, msg.KIND)
            return
        held = self.trust.holder(peer, msg.lease_id, msg.group_id, "score")
        if not self.trust.admit(peer, msg.KIND, held):
            return
        self._take_scored(msg)

    def _take_scored(self, msg: m.Scored) -> None:
        """A group's rewards, checked to come from where they may: advantages, then the
        buffer (or filtered, failed, or held for its teacher)."""
        rollout = self.rollouts.pop(msg.group_id, None)
        if rollout is None or not self.ledger.accept_scored(msg.group_id):
            return
        for err in msg.errors[:3]:
            count = self._warn.allow("reward.error")
            if count is not None:
                log.warning("reward.error", group_id=msg.group_id, error=err, count=count)
        finite = [float(r) for r in msg.rewards if np.isfinite(r)]
        self.recent_rewards.extend(finite)
        algo = self.cfg.algo
        std = stream_batch_std(self.recent_rewards) if algo.advantage.scale == "batch" else None
        got = assemble(
            rollout, msg, algo.advantage, std, algo.returns, algo.gamma, Overlong.of(algo)
        )
        if self.direct is not None:
            self.direct.attach(got.group)
        self._count_failure(msg, got.failed)
        # with a teacher every group carries its per-token signal: none is filtered
        filtering = self.cfg.algo.advantage.filter_zero_signal and self.teaching is None
        if got.failed:
            self.ledger.finish(msg.group_id, "failed")
            return
        self.ledger.source.observe(msg.group_id, msg.rewards)  # the curriculum's pass rates
        if filtering:
            self.ledger.refill.observe(not got.zero_signal)
        if got.zero_signal and filtering:
            self.window_rewards.extend(finite)
            self.ledger.drop_zero_signal(msg.group_id)  # refilled, or a hole of the next step
        elif self.teaching is not None:
            self.teaching.hold(got.group)  # buffered once its teacher answers
        else:
            self.to_buffer(got.group)

    def to_buffer(self, group: Group) -> None:
        for evicted in self.buffer.add(group):
            if evicted.uses == 0:
                self.ledger.finish(evicted.group_id, "stale")

    def on_taught(self, peer: Peer, msg: Taught) -> None:
        if self.teaching is None:
            self._refuse(peer.identity, "unexpected_kind", "no teacher in this run", msg.KIND)
            return
        refused = check_taught(msg, self.teaching.groups.get(msg.group_id))
        if refused is not None:
            self._refuse(peer.identity, "bad_taught", refused, msg.KIND)
            return
        if not self.trust.admit(
            peer, msg.KIND, self.trust.holder(peer, msg.lease_id, msg.group_id, "teach")
        ):
            return  # only the teacher that holds the lease may teach its group
        self.teaching.on_taught(msg)

    def on_meta(self, peer: Peer, msg: RolloutMeta) -> None:
        """hub.payloads = "direct": a generator's announcement of a stored Rollout (its
        content is checked where it is fetched; the lease and quarantine here)."""
        direct = self.direct
        held = self.trust.holder(peer, msg.lease_id, msg.group_id, "generate")
        if direct is None or not self.trust.admit(peer, msg.KIND, held):
            return
        direct.on_meta(peer, msg)
        if msg.group_id in self.rollouts:
            self.trust.accepted(msg.group_id, peer)

    def _count_failure(self, msg: m.Scored, failed: bool) -> None:
        """Groups whose every reward failed, in a row: past `run.abort_after_failed_groups`
        the run cannot learn anything, so it stops, with one line naming the reward."""
        self._failed_in_row = self._failed_in_row + 1 if failed else 0
        reason = failure_streak(msg, self._failed_in_row, self.cfg.run.abort_after_failed_groups)
        if reason is not None:
            self._abort(reason)
