"""Verified rollouts: the trainer's evidence that each generator samples from the policy it
claims, and the quarantine of one that does not.

The trainer computes its own log-prob of every sampled token anyway (pi_prox, the
off-policy correction); per trained group it reports the mean |log pi_trainer - log
pi_behaviour| per completion token and the group's staleness (`RolloutEvidence`). An honest
generator's gap is numerics (bf16 engines against the trainer's precision) and staleness
(the trainer moved on since the group was sampled); both are shared by the whole fleet at a
given staleness. A generator sampling from another model than it claims disagrees with the
trainer by much more.

So a group's excess is its gap minus the fleet's typical gap at its staleness (the 25th
percentile of the last groups at that staleness, every generator's: robust while more than
a quarter of them are honest); a generator is quarantined once the median excess of its last
`window` groups exceeds `max_gap`.

Invariants:
- a generator is judged only on a full window of its own groups;
- quarantine is reported once per generator (the grouper then re-dispatches its leases and
  drops its unconsumed groups); a quarantined generator stays so for the run, restarts
  included (by instance name).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from grpo_stream.config.transport import VerifySettings
from grpo_stream.protocols import messages as m

PRODUCED_KEPT = 65536
"""Groups whose generator is remembered until their evidence comes."""
BASELINE_GROUPS = 256
"""Recent groups per staleness the fleet's typical gap is taken over."""
BASELINE_QUANTILE = 25.0


@dataclass
class Verdict:
    """A generator just quarantined, with the numbers that did it."""

    instance: str
    median_excess: float
    groups: int


@dataclass
class Verifier:
    """Per generator, the excess gap of its last groups; who is quarantined."""

    settings: VerifySettings
    produced: OrderedDict[int, str] = field(default_factory=OrderedDict)
    excess: dict[str, deque[float]] = field(default_factory=dict)
    baseline: dict[int, deque[float]] = field(default_factory=dict)
    quarantined: set[str] = field(default_factory=set)
    worst: dict[str, float] = field(default_factory=dict)  # highest median excess seen
    judged: Counter[str] = field(default_factory=Counter)  # trained groups with evidence

    def produced_by(self, group_id: int, instance: str) -> None:
        """`instance` generated `group_id` (its Rollout was accepted)."""
        self.produced[group_id] = instance
        self.produced.move_to_end(group_id)
        if len(self.produced) > PRODUCED_KEPT:
            self.produced.popitem(last=False)

    def generator_of(self, group_id: int) -> str | None:
        return self.produced.get(group_id)

    def evidence(self, msg: m.RolloutEvidence) -> list[Verdict]:
        """Take one trainer step's evidence; the generators it newly quarantines."""
        rows = [
            (self.produced.get(gid), gap, stale)
            for gid, gap, n, stale in zip(
                msg.group_ids, msg.gaps, msg.tokens, msg.staleness, strict=True
            )
            if n > 0 and np.isfinite(gap)
        ]
        for _, gap, stale in rows:
            self.baseline.setdefault(stale, deque(maxlen=BASELINE_GROUPS)).append(gap)
        judged: set[str] = set()
        for instance, gap, stale in rows:
            if instance is None:
                continue
            typical = float(np.percentile(list(self.baseline[stale]), BASELINE_QUANTILE))
            window = self.excess.setdefault(instance, deque(maxlen=self.settings.window))
            window.append(gap - typical)
            self.judged[instance] += 1
            judged.add(instance)
        return [v for i in sorted(judged) if (v := self._judge(i)) is not None]

    def quarantine(self, instance: str) -> bool:
        """Quarantine `instance` for another reason than its evidence (impossible rollouts);
        whether it is new (False: already, or `enabled` is off)."""
        if not self.settings.enabled or instance in self.quarantined:
            return False
        self.quarantined.add(instance)
        return True

    def _judge(self, instance: str) -> Verdict | None:
        window = self.excess[instance]
        if len(window) < self.settings.window:
            return None
        median = float(np.median(list(window)))
        self.worst[instance] = max(self.worst.get(instance, -np.inf), median)
        if not self.settings.enabled or instance in self.quarantined:
            return None
        if median <= self.settings.max_gap:
            return None
        self.quarantined.add(instance)
        return Verdict(instance, median, len(window))
