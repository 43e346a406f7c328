"""A discrete-event simulation of dynamic sampling through the hub's real gate, ledger, replay
buffer and batch desk (`grpo_stream.hub`): no model, no sockets, simulated time.

Generators lease prompts through `Ledger.take_for_generation` (the staleness gate, with its
refill planning) and take `gen_s` per prompt; a generator holding an older version than the
lease's `min_version` waits for the trainer, as a real one waits for weights. Each group comes
back without signal with probability `zero_signal` (seeded); those are dropped through
`Ledger.drop_zero_signal` (refilled, or a hole of the next step), the others are buffered.
The trainer asks the `BatchDesk` for step k at version k and trains `train_s` per step.

What it measures: steps served full (groups_per_step groups), the trainer's wait for each
step, prompts generated per step. The same code decides in the hub: only the clock is fake.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import numpy as np

from grpo_stream.config import HubSettings, ReplaySettings
from grpo_stream.hub.batches import offline_stats
from grpo_stream.hub.ledger import Ledger
from grpo_stream.hub.replay import Group, ReplayBuffer
from grpo_stream.hub.serving import BatchDesk
from grpo_stream.protocols import messages as m


@dataclass(frozen=True)
class SimSettings:
    groups_per_step: int = 16
    max_staleness: int = 1
    zero_signal: float = 0.4
    """Probability that a group's rewards are all equal."""
    generators: int = 1
    batch: int = 16
    """Prompts a generator leases at once (generator.prompts_per_request)."""
    gen_s: float = 0.01
    """Simulated seconds one generator takes per prompt."""
    batch_s: float = 0.0
    """Simulated seconds one generator takes per lease besides its prompts (a batched
    engine's fixed cost: prefill and decoding steps run for the whole batch)."""
    train_s: float = 0.2
    """Simulated seconds of one trainer step."""
    train_group_s: float = 0.0
    """Simulated seconds the trainer takes per group of a step, besides train_s."""
    steps: int = 100
    seed: int = 0


@dataclass
class SimResult:
    ratio: float
    step_groups: list[int] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    prompts: int = 0
    counters: dict[str, int] = field(default_factory=dict)

    def full_share(self, groups_per_step: int) -> float:
        return sum(g == groups_per_step for g in self.step_groups) / len(self.step_groups)

    def mean_wait(self) -> float:
        """Mean wait per step after the first (the first waits for the pipeline to fill)."""
        return float(np.mean(self.waits[1:])) if len(self.waits) > 1 else float("nan")


def _group(gid: int, version: int) -> Group:
    return Group(
        group_id=gid,
        policy_version=version,
        prompt_ids=np.array([1], np.int32),
        completion_ids=np.array([2, 3], np.int32),
        completion_offsets=np.array([0, 1, 2], np.int64),
        logprobs=np.array([-0.5, -0.5], np.float32),
        rewards=np.array([1.0, 0.0], np.float32),
        advantages=np.array([0.7, -0.7], np.float32),
        valid=np.array([True, True]),
        sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=1),
    )


class Sim:
    def __init__(self, ratio: float, s: SimSettings, ahead: bool = False) -> None:
        self.s = s
        self.rng = random.Random(s.seed)
        self.ledger = Ledger(s.groups_per_step, s.max_staleness, 1e12, ratio, ahead)
        self.buffer = ReplayBuffer(capacity=1 << 20)
        hub = HubSettings(
            groups_per_step=s.groups_per_step,
            max_staleness=s.max_staleness,
            max_refill_ratio=ratio,
            replay=ReplaySettings(capacity=1 << 20),
        )
        self.sent: list[m.TrainBatch] = []
        self.desk = BatchDesk(hub, self.ledger, self.buffer, self._send, offline_stats)
        self.result = SimResult(ratio)
        self.version = 0  # the trainer's, as the generators can fetch it
        self.events: list[tuple[float, int, str, int]] = []  # (time, order, kind, who)
        self.order = 0
        self.batches: dict[int, tuple[list[int], int]] = {}  # generator -> (groups, version)
        self.waiting: dict[int, tuple[list[int], int]] = {}  # generator -> (groups, min_version)
        self.idle = set(range(s.generators))

    def _send(self, identity: bytes, msg: m.Message) -> None:
        if isinstance(msg, m.TrainBatch):
            self.sent.append(msg)

    def _at(self, t: float, kind: str, who: int = 0) -> None:
        self.order += 1
        heapq.heappush(self.events, (t, self.order, kind, who))

    def _lease(self, now: float) -> None:
        for gen in sorted(self.idle):
            taken = self.ledger.take_for_generation(f"gen-{gen}", self.s.batch, now)
            if taken is None:
                return
            lease, min_version = taken
            self.idle.discard(gen)
            self.waiting[gen] = (sorted(lease.group_ids), min_version)
            self.result.prompts += len(lease.group_ids)
        self._start(now)

    def _start(self, now: float) -> None:
        """Generators whose lease's min_version is out start sampling with the newest."""
        for gen, (ids, min_version) in list(self.waiting.items()):
            if min_version <= self.version:  # a real generator waits for these weights
                del self.waiting[gen]
                self.batches[gen] = (ids, self.version)
                self._at(now + self.s.batch_s + len(ids) * self.s.gen_s, "generated", gen)

    def _generated(self, gen: int) -> None:
        ids, version = self.batches.pop(gen)
        self.idle.add(gen)
        for gid in ids:
            if not self.ledger.accept_rollout(gid):
                continue
            if self.ledger.versions.is_stale(version):
                self.ledger.finish(gid, "stale")
                continue
            self.ledger.take_for_scoring("scorer", 0.0)
            self.ledger.accept_scored(gid)
            signal = self.rng.random() >= self.s.zero_signal
            self.ledger.refill.observe(signal)
            if signal:
                self.buffer.add(_group(gid, version))
            else:
                self.ledger.drop_zero_signal(gid)

    def run(self) -> SimResult:
        now, asked = 0.0, 0.0
        self.desk.add(b"trainer", m.BatchRequest(step=0, trainer_version=0))
        while len(self.result.step_groups) < self.s.steps:
            self._lease(now)
            before = len(self.sent)
            self.desk.serve()
            if len(self.sent) > before:  # the step went out: the trainer trains it
                groups = len(np.asarray(self.sent[-1].group_ids))
                self.result.step_groups.append(groups)
                self.result.waits.append(now - asked)
                self._at(now + self.s.train_s + groups * self.s.train_group_s, "trained")
            if not self.events:
                raise RuntimeError(f"simulation stalled at step {len(self.result.step_groups)}")
            now, _, kind, who = heapq.heappop(self.events)
            if kind == "generated":
                self._generated(who)
            else:  # a step trained: the next version is out, the trainer asks again
                self.version += 1
                self._start(now)
                asked = now
                self.desk.add(
                    b"trainer", m.BatchRequest(step=self.version, trainer_version=self.version)
                )
        self.ledger.check_invariant()
        self.result.counters = self.ledger.summary()
        return self.result


def simulate(ratio: float, settings: SimSettings, ahead: bool = False) -> SimResult:
    """One simulated run at `hub.max_refill_ratio = ratio` (and `hub.refill_ahead`)."""
    return Sim(ratio, settings, ahead).run()
