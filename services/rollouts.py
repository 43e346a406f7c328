"""Rollouts as the generator sends them: one group's completions flattened, with the
run-length versions of its tokens.

Invariant: a Rollout's `policy_version` is the oldest version that sampled any of its tokens;
the run fields are empty on the wire when one version sampled them all.
"""

from __future__ import annotations

import numpy as np

from grpo_stream.protocols import messages as m
from grpo_stream.sampling import Completion, GroupSample


def group_rollout(
    batch: m.PromptBatch,
    group_id: int,
    instance: str,
    sample: GroupSample,
    seconds: float,
    version: int,
) -> m.Rollout:
    """The Rollout of one group; completions without version runs count as `version`'s."""
    comps = sample.completions
    lengths = [len(c.token_ids) for c in comps]
    offsets = np.zeros(len(comps) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    flat_ids = [t for c in comps for t in c.token_ids]
    flat_lp = [lp for c in comps for lp in c.logprobs]
    starts, versions = token_version_runs(comps, offsets, version)
    return m.Rollout(
        lease_id=batch.lease_id,
        group_id=group_id,
        instance=instance,
        policy_version=min(versions),
        prompt_ids=np.array(sample.prompt_ids, dtype=np.int32),
        completion_ids=np.array(flat_ids, dtype=np.int32),
        completion_offsets=offsets,
        logprobs=np.array(flat_lp, dtype=np.float32),
        texts=[c.text for c in comps],
        truncated=[c.truncated for c in comps],
        gen_seconds=seconds,
        sampling=batch.sampling,
        token_version_starts=_on_wire(starts, versions),
        token_versions=_on_wire(versions, versions),
    )


def token_version_runs(
    comps: list[Completion], offsets: np.ndarray, version: int
) -> tuple[list[int], list[int]]:
    """(starts in the flat completion ids, versions) of the group's runs of tokens sampled
    with one version; a completion without runs was sampled wholly by `version`."""
    starts: list[int] = []
    versions: list[int] = []
    for c, off in zip(comps, offsets[:-1].tolist(), strict=True):
        for start, v in c.version_runs or [(0, version)]:
            if not versions or versions[-1] != v:
                starts.append(off + start)
                versions.append(v)
    return starts or [0], versions or [version]


def _on_wire(values: list[int], versions: list[int]) -> np.ndarray:
    """A run field of the Rollout: empty (the wire as before) when one version sampled all."""
    return np.array(values if len(set(versions)) > 1 else [], dtype=np.int64)


def empty_rollout(
    batch: m.PromptBatch,
    group_id: int,
    instance: str,
    version: int,
    seconds: float,
) -> m.Rollout:
    """A Rollout with its identity filled in and no completions yet."""
    empty = np.zeros(0, dtype=np.int32)
    return m.Rollout(
        lease_id=batch.lease_id,
        group_id=group_id,
        instance=instance,
        policy_version=version,
        prompt_ids=empty,
        completion_ids=empty,
        completion_offsets=np.zeros(1, dtype=np.int64),
        logprobs=np.zeros(0, dtype=np.float32),
        texts=[],
        truncated=[],
        gen_seconds=seconds,
        sampling=batch.sampling,
    )
