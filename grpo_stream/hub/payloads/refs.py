"""References instead of payloads (`hub.payloads = "direct"`): what the generator tells the
hub (`rollout_meta`), what the hub keeps of a group (a shell Rollout: lengths, no tokens),
the TrainBatchRef shards it sends, and the trainer's side: checking each fetched Rollout
against the reference and building the TrainBatch the hub would have sent.

Invariant: `materialize(build_ref_step(...)[r], fetched)` equals `build_step(...)[r]` for
the same groups when every fetched Rollout is the one the generator announced (same
digest); a Rollout that differs from its reference in group, version, completion count or
lengths is refused by `check_payload` and never trained.
"""

from __future__ import annotations

import re

import numpy as np

from grpo_stream.hub.batches import shard, step_totals
from grpo_stream.hub.guard import check_rollout
from grpo_stream.hub.payloads.store import PayloadFetcher, PayloadRef
from grpo_stream.hub.replay import Group
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.payloads import PayloadLost, RolloutMeta, ScoreRef, TrainBatchRef

_DIGEST = re.compile(r"^[0-9a-f]{32}$")


def check_meta(meta: RolloutMeta, group_size: int) -> str | None:
    """A RolloutMeta the hub can account for: G lengths, none negative, a digest, an address."""
    lens = np.asarray(meta.completion_lens)
    if len(lens) != group_size or len(meta.truncated) != group_size:
        return f"rollout_meta of group {meta.group_id} has {len(lens)} completions, G={group_size}"
    if lens.dtype.kind not in "iu" or np.any(lens < 0) or meta.prompt_len < 0:
        return f"rollout_meta of group {meta.group_id}: negative or non-integer lengths"
    if not _DIGEST.match(meta.digest):
        return f"rollout_meta of group {meta.group_id}: digest is not 32 hex characters"
    if not meta.source.startswith(("tcp://", "ipc://")):
        return f"rollout_meta of group {meta.group_id}: source is not a tcp:// or ipc:// address"
    return None


def shell_rollout(meta: RolloutMeta) -> m.Rollout:
    """What the hub keeps of a group it does not hold: lengths as offsets, no tokens, empty
    texts (G of them, so the Scored checks and `assemble` see the group's size)."""
    lens = np.asarray(meta.completion_lens, dtype=np.int64)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lens)
    empty = np.zeros(0, dtype=np.int32)
    return m.Rollout(
        lease_id=meta.lease_id,
        group_id=meta.group_id,
        instance=meta.instance,
        policy_version=meta.policy_version,
        prompt_ids=empty,
        completion_ids=empty,
        completion_offsets=offsets,
        logprobs=np.zeros(0, dtype=np.float32),
        texts=[""] * len(lens),
        truncated=list(meta.truncated),
        gen_seconds=meta.gen_seconds,
        sampling=meta.sampling,
    )


def build_ref_step(
    step: int, groups: list[Group], stats: m.StepStats, world: int = 1
) -> list[TrainBatchRef]:
    """`build_step` by reference: one TrainBatchRef per rank (rank r gets groups r, r+W, ...)."""
    totals = step_totals(step, groups)
    sampling = groups[0].sampling
    return [_ref_shard(step, groups[r::world], totals, sampling, stats) for r in range(world)]


def _ref_shard(
    step: int,
    groups: list[Group],
    totals: m.BatchTotals,
    sampling: m.SamplingParams,
    stats: m.StepStats,
) -> TrainBatchRef:
    sizes = [g.size for g in groups]
    offsets = np.zeros(len(groups) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(sizes)

    def flat(name: str, dtype: type) -> np.ndarray:
        parts: list[np.ndarray] = [np.asarray(getattr(g, name), dtype=dtype) for g in groups]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    return TrainBatchRef(
        step=step,
        group_ids=np.array([g.group_id for g in groups], dtype=np.int64),
        sources=[g.source for g in groups],
        digests=[g.digest for g in groups],
        versions=np.array([g.policy_version for g in groups], dtype=np.int64),
        group_offsets=offsets,
        completion_lens=flat_lens(groups),
        rewards=flat("rewards", np.float32),
        advantages=flat("advantages", np.float32),
        valid=flat("valid", np.uint8),
        totals=totals,
        sampling=sampling,
        stats=stats,
    )


def flat_lens(groups: list[Group]) -> np.ndarray:
    """Every completion's length, group after group: int64 (sum of G,)."""
    lens = [np.diff(np.asarray(g.completion_offsets, dtype=np.int64)) for g in groups]
    return np.concatenate(lens) if lens else np.zeros(0, np.int64)


def refs_of(batch: TrainBatchRef) -> list[PayloadRef]:
    """Where each group of the batch is to be fetched."""
    return [
        PayloadRef(int(gid), source, digest)
        for gid, source, digest in zip(batch.group_ids, batch.sources, batch.digests, strict=True)
    ]


def check_payload(batch: TrainBatchRef, i: int, rollout: m.Rollout) -> str | None:
    """None if `rollout` is group i of `batch` as the hub accounted for it."""
    lo, hi = int(batch.group_offsets[i]), int(batch.group_offsets[i + 1])
    gid = int(batch.group_ids[i])
    bad = check_rollout(rollout, hi - lo)
    if bad is not None:
        return bad
    if rollout.group_id != gid or rollout.policy_version != int(batch.versions[i]):
        return f"group {gid}: payload is group {rollout.group_id} at v{rollout.policy_version}"
    lens = np.diff(np.asarray(rollout.completion_offsets, dtype=np.int64))
    if not np.array_equal(lens, np.asarray(batch.completion_lens[lo:hi], dtype=np.int64)):
        return f"group {gid}: payload's completion lengths are not the announced ones"
    return None


def materialize(batch: TrainBatchRef, fetched: dict[int, m.Rollout]) -> m.TrainBatch:
    """The TrainBatch of `batch` from its groups' checked payloads (`check_payload`)."""
    groups = []
    for i, gid in enumerate(int(g) for g in batch.group_ids):
        ro = fetched[gid]
        lo, hi = int(batch.group_offsets[i]), int(batch.group_offsets[i + 1])
        groups.append(
            Group(
                group_id=gid,
                policy_version=int(batch.versions[i]),
                prompt_ids=np.asarray(ro.prompt_ids, dtype=np.int32),
                completion_ids=np.asarray(ro.completion_ids, dtype=np.int32),
                completion_offsets=np.asarray(ro.completion_offsets, dtype=np.int64),
                logprobs=np.asarray(ro.logprobs, dtype=np.float32),
                rewards=np.asarray(batch.rewards[lo:hi], dtype=np.float32),
                advantages=np.asarray(batch.advantages[lo:hi], dtype=np.float32),
                valid=np.asarray(batch.valid[lo:hi]).astype(bool),
                sampling=batch.sampling,
                truncated=list(ro.truncated),
            )
        )
    return shard(batch.step, groups, batch.totals, batch.sampling, batch.stats)


def score_request_of(
    ref: ScoreRef, got: m.Rollout | str, group_size: int
) -> m.ScoreRequest | PayloadLost:
    """A scorer's ScoreRequest from the payload it fetched for `ref` (the hub's prompt and
    reference, the generator's texts), or the PayloadLost to tell the hub instead."""
    if isinstance(got, m.Rollout):
        bad = check_rollout(got, group_size)
        if bad is None:
            return m.ScoreRequest(
                lease_id=ref.lease_id,
                group_id=ref.group_id,
                prompt=ref.prompt,
                completions=list(got.texts),
                reference=dict(ref.reference),
            )
        got = "mismatch"
    return PayloadLost(group_ids=[ref.group_id], reason=f"scorer: {got}", codes=[got])


def fetch_batch(
    fetcher: PayloadFetcher, batch: TrainBatchRef, version: int, attempt: int
) -> m.TrainBatch | PayloadLost:
    """The trainer's TrainBatch for `batch`, every group fetched and checked, or the
    PayloadLost naming the groups it could not get (the hub then serves the step anew)."""
    fetched = fetcher.fetch(refs_of(batch))
    good: dict[int, m.Rollout] = {}
    lost, codes = [], []
    for i, gid in enumerate(int(g) for g in batch.group_ids):
        got = fetched.get(gid, "unreachable")
        if isinstance(got, m.Rollout) and check_payload(batch, i, got) is None:
            good[gid] = got
            continue
        lost.append(gid)
        codes.append(got if isinstance(got, str) else "mismatch")
    if not lost:
        return materialize(batch, good)
    return PayloadLost(
        group_ids=lost,
        reason=f"trainer: {len(lost)} of {len(good) + len(lost)} groups",
        step=batch.step,
        trainer_version=version,
        attempt=attempt,
        codes=codes,
    )
