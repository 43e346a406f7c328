"""The trainer's evidence for verified rollouts (`grpo_stream.hub.verify`): per group of a
step, the mean |log pi_trainer - log pi_behaviour| per completion token, from the per-sequence
sums the off-policy meter gathered (`training.offpolicy.OffPolicyMeter.rows`). Light on
purpose (numpy, no torch): the trainer's entry point imports it before torch loads."""

from __future__ import annotations

import numpy as np

from grpo_stream.protocols.messages import RolloutEvidence, TrainBatch

Rows = dict[int, tuple[float, float, int]]
"""TrainBatch sequence -> (gap sum, tokens, staleness)."""


def group_evidence(rows: Rows, batch: TrainBatch) -> RolloutEvidence:
    """The step's per-group evidence: each group's mean gap per completion token, its tokens
    and staleness (its sequences share one version); sequences map to groups by
    `TrainBatch.group_offsets`."""
    offsets = np.asarray(batch.group_offsets, dtype=np.int64)
    gids = [int(g) for g in batch.group_ids]
    sums = [0.0] * len(gids)
    counts = [0] * len(gids)
    stale = [0] * len(gids)
    for seq, (gap_sum, tokens, k) in rows.items():
        i = int(np.searchsorted(offsets, seq, side="right")) - 1
        if 0 <= i < len(gids):
            sums[i] += gap_sum
            counts[i] += int(tokens)
            stale[i] = k
    gaps = [s / n if n else 0.0 for s, n in zip(sums, counts, strict=True)]
    return RolloutEvidence(
        step=batch.step, group_ids=gids, gaps=gaps, tokens=counts, staleness=stale
    )
