"""Several optimizer updates per batch (`trainer.minibatches`, PPO-style).

A batch's rows are split into K contiguous minibatches of near-equal size (fewer when the
batch has fewer than K rows); each is one optimizer step of its own: forward and backward
over its micro-batches, normalised by the minibatch's own totals, then the rollback guard,
the regularizer and AdamW, exactly as a one-minibatch step. What holds the K steps together:

- pi_prox (a weighted algo.loss.off_policy: tis, decoupled, icepop, seq_tis) is computed
  once per batch, for every minibatch, from the weights at the start of the batch, before
  the first update
  (`TrainState._proximal`); so from minibatch 2 on the ratio pi_theta / pi_prox moves away
  from 1 and the clip binds, which one update per batch never lets it do.
- The batch is the unit the rest of the system sees: step, policy version and lr schedule
  advance once per batch, and a rollback on any minibatch discards the whole batch (it
  restores the last restore point, at or before the start of the batch), so a published
  version never holds half a batch and the hub's staleness still counts batches.
- Metrics are token-weighted means over the minibatches (`merge`), plus `minibatches`
  (updates applied) and `clip_frac_later` (the clip fraction of minibatches 2..K: the
  trust region that several updates bring).

K = 1 (the default) is the step as it always was. Several ranks are refused with K > 1:
each minibatch's normalisers would have to be summed across ranks (not done).
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_stream.algo.loss import loss_totals
from grpo_stream.protocols.messages import BatchTotals
from grpo_stream.training.batch import Tensors


def split_rows(t: Tensors, k: int) -> list[Tensors]:
    """`t`'s rows as min(k, rows) contiguous minibatches of near-equal size (the first ones
    one row larger); k = 1 returns [t] itself."""
    if k <= 1 or t.size <= 1:
        return [t]
    bounds = torch.arange(t.size).tensor_split(min(k, t.size))
    return [t.slice(int(b[0]), int(b[-1]) + 1) for b in bounds]


def own_totals(t: Tensors) -> tuple[float, float]:
    """A minibatch's loss normalisers on one rank: its sequences and completion tokens."""
    return float(t.size), float(t.completion_mask.sum())


def shard_totals(t: Tensors, step: int, total: BatchTotals, world_size: int) -> tuple[float, float]:
    """Loss normalisers: the whole step's counts (`TrainBatch.totals`, over every rank's
    shard), divided by the ranks (DDP and FSDP2 average the ranks' gradients). Totals
    that cannot be the step's (fewer than this shard holds; or, on one rank, not its
    counts) are refused: they would scale the update wrongly without a sign."""
    seqs, tokens = loss_totals(t.completion_mask)
    smaller = total.num_seqs < seqs or total.num_tokens < tokens
    if smaller or (world_size == 1 and (total.num_seqs, total.num_tokens) != (seqs, tokens)):
        raise ValueError(
            f"step {step}: TrainBatch.totals ({total.num_seqs} sequences, "
            f"{total.num_tokens} tokens) cannot be the step's: this shard has {seqs} "
            f"sequences, {tokens} tokens on {world_size} rank(s)"
        )
    return total.num_seqs / world_size, total.num_tokens / world_size


def merge(updates: list[tuple[dict[str, Any], float]]) -> dict[str, Any]:
    """One step's metrics from its minibatches' (metrics, completion tokens): the only
    update's as they are, else token-weighted means (reg_fired: any; tau: the last)."""
    if len(updates) == 1:
        return dict(updates[0][0])
    total = max(sum(n for _, n in updates), 1.0)
    keys = {k for m, _ in updates for k in m}
    out: dict[str, Any] = {
        k: sum(float(m[k]) * n for m, n in updates if k in m) / total for k in sorted(keys)
    }
    out["reg_fired"] = any(bool(m["reg_fired"]) for m, _ in updates)
    out["tau"] = updates[-1][0]["tau"]
    later = updates[1:]
    later_tokens = max(sum(n for _, n in later), 1.0)
    out["clip_frac_later"] = sum(float(m["clip_frac"]) * n for m, n in later) / later_tokens
    out["minibatches"] = len(updates)
    return out
