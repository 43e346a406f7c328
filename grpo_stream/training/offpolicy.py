"""The trainer's side of the off-policy correction: pi_prox and the mismatch metrics.

`proximal_logprobs` is the extra forward of a weighted `algo.loss.off_policy` (tis,
decoupled, icepop, seq_tis): the trainer's own log-probs of a micro-batch under its weights at
the start of the step, without grad. The weights do not change between the micro-batches of
one optimizer step (it steps once, after all of them), so computing it micro-batch by
micro-batch gives exactly the start-of-step values, whatever the micro-batching. With one
update per batch (trainer.minibatches = 1) and a deterministic forward
(`deterministic_forward`: no dropout) those values are the with-grad forward's own
log-probs, detached, so the trainer takes them from there and runs no extra forward; with
dropout on, or from the second minibatch on (training/minibatches.py: computed once per
batch before the first update), it runs.

`OffPolicyMeter` gathers, over one step's micro-batches, what users watch for train/inference
mismatch and staleness:

- is_weight_mean / is_weight_max: u = pi_trainer / pi_behaviour per completion token,
  before truncation (pi_trainer is pi_prox, or the with-grad forward's detached values when
  no extra forward runs: the same weights, so the same numbers);
- is_over_cap_frac: fraction of tokens with u > is_cap (what tis truncates, decoupled drops);
- logp_gap: mean |log pi_trainer - log pi_behaviour| per token;
- logp_gap_stale{k}: the same over tokens generated k versions before the trained version;
- per sequence, its gap sum, tokens and staleness (`rows`): `training.evidence` turns them
  into the step's `RolloutEvidence`, per group, for the hub's verified rollouts.

Under FSDP2 a rank with fewer micro-batches repeats its last one at zero weight (see
TrainState._passes); that filler is counted here once more (means shift slightly, the max
does not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_stream.config import RunConfig
from grpo_stream.training.batch import Tensors
from grpo_stream.training.context.groups import ContextGroup
from grpo_stream.training.packing import sequence_logprobs


def deterministic_forward(cfg: RunConfig) -> bool:
    """Whether the training forward is deterministic (no dropout, LoRA's included): then the
    with-grad forward's detached log-probs are pi_prox of a one-update step."""
    lora = cfg.trainer.lora
    return not cfg.trainer.dropout and not (lora.enabled and lora.dropout > 0)


def proximal_logprobs(
    model: Any, part: Tensors, chunk: int, temperature: float, context: ContextGroup | None = None
) -> torch.Tensor:
    """log pi_prox (B, T) of `part`'s tokens under `model` as it is now; no grad, 0 outside
    completions."""
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, part, chunk, temperature, False, context)
    return logp


@dataclass
class OffPolicyMeter:
    """Sums over one step's micro-batches; `summary()` gives the step's metrics."""

    is_cap: float = 2.0
    tokens: float = 0.0
    weight_sum: float = 0.0
    weight_max: float = 0.0
    over: float = 0.0
    gap_sum: float = 0.0
    stale_gap: dict[int, float] = field(default_factory=dict)
    stale_tokens: dict[int, float] = field(default_factory=dict)
    rows: dict[int, tuple[float, float, int]] = field(default_factory=dict)
    """TrainBatch sequence -> (gap sum, tokens, staleness)."""

    def reset(self) -> None:
        self.tokens = self.weight_sum = self.weight_max = self.over = self.gap_sum = 0.0
        self.stale_gap, self.stale_tokens = {}, {}
        self.rows = {}

    def add(self, trainer_logp: torch.Tensor, part: Tensors, version: int) -> None:
        """Count `part`'s completion tokens; `version` is the trainer's version this step."""
        with torch.no_grad():
            mask = part.completion_mask.bool()
            diff = torch.where(mask, trainer_logp.detach().float() - part.old_logp, 0.0)
            weight = torch.where(mask, diff.exp(), 0.0)
            gap = diff.abs()
            per_row_gap = gap.sum(dim=1)  # (B,)
            per_row_tokens = mask.sum(dim=1).float()
            stale = (version - part.versions).clamp(min=0)
            numbers = torch.stack(
                [
                    mask.sum().float(),
                    weight.sum(),
                    weight.max() if weight.numel() else torch.zeros(()),
                    ((weight > self.is_cap) & mask).sum().float(),
                    gap.sum(),
                ]
            ).tolist()
            rows = list(
                zip(stale.tolist(), per_row_gap.tolist(), per_row_tokens.tolist(), strict=True)
            )
        if part.rows is not None:
            for seq, (k, g, n) in zip(part.rows.tolist(), rows, strict=True):
                gap_sum, count, _ = self.rows.get(seq, (0.0, 0.0, 0))
                self.rows[seq] = (gap_sum + g, count + n, int(k))
        tokens, weight_sum, weight_max, over, gap_sum = numbers
        self.tokens += tokens
        self.weight_sum += weight_sum
        self.weight_max = max(self.weight_max, weight_max)
        self.over += over
        self.gap_sum += gap_sum
        for k, g, n in rows:
            self.stale_gap[k] = self.stale_gap.get(k, 0.0) + g
            self.stale_tokens[k] = self.stale_tokens.get(k, 0.0) + n

    def summary(self) -> dict[str, float]:
        n = max(self.tokens, 1.0)
        out = {
            "is_weight_mean": self.weight_sum / n,
            "is_weight_max": self.weight_max,
            "is_over_cap_frac": self.over / n,
            "logp_gap": self.gap_sum / n,
        }
        for k in sorted(self.stale_gap):
            if self.stale_tokens[k] > 0:
                out[f"logp_gap_stale{k}"] = self.stale_gap[k] / self.stale_tokens[k]
        return out
