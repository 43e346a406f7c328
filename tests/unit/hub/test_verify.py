"""Verified rollouts: a generator whose gap stays beyond the fleet's at the same staleness is
quarantined once, on a full window; honest generators with the fleet's gap never are."""

from __future__ import annotations

import numpy as np

from grpo_stream.config.transport import VerifySettings
from grpo_stream.hub.verify import Verifier
from grpo_stream.protocols import messages as m


def step(v: Verifier, step_no: int, gaps: dict[int, float], stale: int = 1) -> list[str]:
    ev = m.RolloutEvidence(step=step_no, group_ids=list(gaps), gaps=list(gaps.values()),
                           tokens=[10] * len(gaps), staleness=[stale] * len(gaps))  # fmt: skip
    return [verdict.instance for verdict in v.evidence(ev)]


def run(v: Verifier, bad_gap: float, steps: int, seed: int = 0) -> list[str]:
    """3 generators, one group each per step; honest gaps drift with staleness, like the
    trainer moving on: 0.05 per version behind, plus noise."""
    rng = np.random.default_rng(seed)
    flagged: list[str] = []
    gid = 0
    for s in range(steps):
        stale = int(rng.integers(0, 3))
        gaps = {}
        for name in ("gen-0", "gen-1", "bad"):
            v.produced_by(gid, name)
            honest = 0.01 + 0.05 * stale + abs(rng.normal(0, 0.02))
            gaps[gid] = honest + (bad_gap if name == "bad" else 0.0)
            gid += 1
        flagged += step(v, s, gaps, stale)
    return flagged


def test_a_generator_far_from_the_trainer_is_quarantined_once() -> None:
    v = Verifier(VerifySettings(window=8, max_gap=0.5))
    assert run(v, bad_gap=2.0, steps=40) == ["bad"]
    assert v.quarantined == {"bad"}
    assert max(v.worst["gen-0"], v.worst["gen-1"]) < 0.1


def test_honest_generators_over_a_long_run_are_never_flagged() -> None:
    v = Verifier(VerifySettings(window=8, max_gap=0.5))
    assert run(v, bad_gap=0.0, steps=2000, seed=1) == []


def test_nothing_is_judged_before_a_full_window() -> None:
    v = Verifier(VerifySettings(window=32, max_gap=0.5))
    assert run(v, bad_gap=5.0, steps=31) == []
    assert run(v, bad_gap=5.0, steps=1) == ["bad"]


def test_off_keeps_the_evidence_but_quarantines_no_one() -> None:
    v = Verifier(VerifySettings(enabled=False, window=8, max_gap=0.5))
    assert run(v, bad_gap=2.0, steps=40) == [] and v.worst["bad"] > 1.0


def test_groups_of_unknown_generators_only_feed_the_baseline() -> None:
    v = Verifier(VerifySettings(window=4, max_gap=0.5))
    assert step(v, 0, {7: 3.0, 8: 3.0}) == [] and v.excess == {}
