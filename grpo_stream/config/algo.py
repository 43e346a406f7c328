"""Settings of the regularized GRPO update (advantages, loss, regularizer, rollback)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grpo_stream.config.distill import DistillSettings


class AdvantageSettings(BaseModel):
    """How group rewards become per-completion advantages."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    scale: Literal["group", "batch", "none"] = "group"
    """Divide by the group's std (GRPO), the batch's std, or not at all (Dr. GRPO)."""
    baseline: Literal["mean", "leave_one_out"] = "mean"
    """Subtract the group mean, or the mean of the other G-1 completions (RLOO)."""
    eps: float = Field(1e-6, gt=0)
    """Added to the std before dividing."""
    filter_zero_signal: bool = True
    """Drop groups whose rewards are all equal (DAPO dynamic sampling); they are counted.
    Why on: such a group has zero advantage everywhere, so it adds tokens to the trainer's
    step and nothing to the gradient but its KL term. Its speed cost is the refill
    (hub.max_refill_ratio) that keeps steps full. Measured on the #46 word-model task (G = 8,
    alternating against TRL, 2026-12-07, quiet): ours/TRL steps/s 0.44-1.02 (median 0.69)
    on against 0.64-1.11 off, reward of the last 15 steps 0.48-0.50 either way: no
    difference beyond the noise on that task, so the learning argument decides."""


OffPolicy = Literal["tis", "decoupled", "icepop", "seq_tis", "behaviour", "none"]
"""The off-policy corrections (`LossSettings.off_policy`)."""
WEIGHTED = ("tis", "decoupled", "icepop", "seq_tis")
"""The off_policy modes that weigh tokens from pi_prox / pi_behaviour."""


class LossSettings(BaseModel):
    """The clipped surrogate, KL penalty and aggregation."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    eps_low: float = Field(0.2, ge=0, le=1)
    """Lower clip range: the ratio is clipped at 1 - eps_low."""
    eps_high: float = Field(0.28, ge=0)
    """Upper clip range (DAPO clip-higher): the ratio is clipped at 1 + eps_high."""
    dual_clip: float | None = Field(None, gt=1)
    """Dual-clip constant c (> 1) bounding the loss for negative advantages; None disables it."""
    off_policy: OffPolicy = "behaviour"
    """Off-policy correction. The weighted modes (tis, decoupled, icepop, seq_tis) take
    pi_prox, the trainer's own log-probs at the start of the batch (from its with-grad forward
    when that is deterministic and there is one update per batch, else one no-grad forward);
    PPO ratio and clip are then taken against pi_prox and each token is weighted from
    u = pi_prox / pi_behaviour (detached): tis truncates u at is_cap; decoupled (AReaL) drops
    tokens with u > is_cap; icepop drops tokens with u outside [is_floor, is_cap]; seq_tis
    gives every token of a sequence its sequence's ratio (the product of its u) truncated at
    is_cap (grpo_stream.algo.importance). behaviour: ratio and clip against the behaviour
    log-probs, no weight, no extra forward. none: plain policy gradient, no ratio to any old
    policy and no weight (for comparison). Default behaviour: the best at staleness 4 in
    bench.off_policy with one update per batch; with trainer.minibatches > 1 tis kept more of
    the on-policy gain (docs/guide/off-policy.md)."""
    is_cap: float = Field(2.0, gt=0)
    """C: the cap of the importance weight (tis and seq_tis truncate at it, decoupled and
    icepop drop the tokens above it)."""
    is_floor: float | None = Field(None, gt=0)
    """icepop: the lower edge of the band of kept tokens, [is_floor, is_cap]; None: 1 / is_cap
    (the band [1/k, k])."""
    seq_mask: Literal["none", "geometric", "arithmetic"] = "none"
    """With a weighted off_policy mode: drop whole sequences whose ratio statistic lies outside
    [seq_mask_low, seq_mask_high], the geometric mean exp(mean log u) or the arithmetic mean
    mean u of the sequence's token ratios (none: no sequence mask)."""
    seq_mask_low: float = Field(0.8, gt=0)
    """seq_mask: a sequence whose statistic is below this is dropped. The default band
    [0.8, 1.25] drops the tail of stale data (in bench.off_policy at staleness 4, one seed,
    [0.9, 1.1] dropped 20-40% of the tokens by step 40); data off by numerics alone sits much
    closer to 1 (the peers use bands like [0.999, 1.001] there)."""
    seq_mask_high: float = Field(1.25, gt=0)
    """seq_mask: a sequence whose statistic is above this is dropped."""
    behaviour_clip: bool = False
    """With a weighted off_policy mode: also give no loss to the tokens where behaviour's clip
    binds (pi_theta / pi_behaviour above 1 + eps_high with A > 0, below 1 - eps_low with
    A < 0), so the weight and the trust region around pi_prox come with behaviour's trust
    region around the data's own policy. With one update per batch: behaviour with its weight
    truncated."""
    beta: float = Field(0.0, ge=0)
    """Weight of the k3 KL to the frozen reference; 0 loads no reference model."""
    aggregation: Literal["grpo", "dapo", "dr_grpo"] = "grpo"
    """Per-sequence mean then mean (grpo), token mean (dapo), or sum / (B x max_tokens) (dr_grpo)"""
    logprob_chunk: int = Field(0, ge=0)
    """Sequences per chunk when computing token log-probs, bounding (chunk, T, V) memory;
    0 sizes chunks so the float32 logits of one chunk stay under logprob_chunk_mb."""
    logprob_chunk_mb: float = Field(256.0, gt=0)
    """Memory budget of one chunk's (chunk, T, V) float32 logits when logprob_chunk is 0."""

    @model_validator(mode="after")
    def _check(self) -> LossSettings:
        weighted = ", ".join(WEIGHTED)
        if self.behaviour_clip and not self.weighted:
            raise ValueError(f"loss.behaviour_clip needs loss.off_policy in {weighted}")
        if self.seq_mask != "none" and not self.weighted:
            raise ValueError(f"loss.seq_mask needs loss.off_policy in {weighted}")
        if self.seq_mask_low >= self.seq_mask_high:
            raise ValueError(
                f"loss.seq_mask_low ({self.seq_mask_low}) must be below loss.seq_mask_high "
                f"({self.seq_mask_high})"
            )
        if self.is_floor is not None and self.off_policy != "icepop":
            raise ValueError(
                f"loss.is_floor applies only to loss.off_policy = icepop (not "
                f"{self.off_policy!r}): remove it or choose icepop"
            )
        if self.is_floor is not None and self.is_floor >= self.is_cap:
            raise ValueError(
                f"loss.is_floor ({self.is_floor}) must be below loss.is_cap ({self.is_cap})"
            )
        return self

    @property
    def weighted(self) -> bool:
        """Whether off_policy weighs tokens by pi_prox / pi_behaviour: the trainer then needs
        pi_prox (its log-probs at the start of the step)."""
        return self.off_policy in WEIGHTED

    def chunk_for(self, length: int, vocab: int) -> int:
        """Sequences per log-prob chunk for sequences of `length` tokens and a `vocab`."""
        if self.logprob_chunk:
            return self.logprob_chunk
        per_sequence = max(1, length * vocab * 4)
        return max(1, int(self.logprob_chunk_mb * 2**20 // per_sequence))


class RegularizerSettings(BaseModel):
    """The adaptive gradient-norm regularizer (the 'regularized' in regularized GRPO)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = True
    """Apply the proximal shrink toward tau and the hard clip at 2*tau."""
    alpha: float = Field(0.9, gt=0, lt=1)
    """EMA factor of tau, updated after each step with the norm AFTER the shrink and clip:
    tau <- alpha*tau + (1-alpha)*min(||g||, ||g_after||) (grpo_stream.algo.regularizer)."""
    lam: float = Field(1.0, ge=0)
    """lambda of the penalty lambda/2 * (||g|| - tau)^2 applied when ||g|| > tau."""
    tau0: float | None = Field(None, gt=0)
    """Initial tau; None sets it from the first step's norm times init_fraction."""
    init_fraction: float = Field(0.5, gt=0)
    """Fraction of the first step's gradient norm used as the initial tau when tau0 is None."""
    clip_factor: float = Field(2.0, gt=1)
    """Hard clip at clip_factor * tau after the proximal step."""
    explode_factor: float | None = Field(10.0, gt=1)
    """A norm above explode_factor * tau is an explosion: the step is skipped and rolled back
    (as is a norm that overflows to inf); None disables the check."""
    explode_after: int = Field(5, ge=0)
    """Finite steps before an explosion can be declared, unless tau0 is given: a tau taken
    from the first step is no scale yet (a LoRA adapter starts with B = 0, so its norm grows
    many-fold over the first steps); the 2*tau clip still bounds those steps."""


class RollbackSettings(BaseModel):
    """What happens on a non-finite loss or gradient."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    lr_factor: float = Field(0.8, gt=0, lt=1)
    """Learning rate multiplier applied on each rollback."""
    tau_raise: float = Field(1.5, ge=1)
    """tau multiplier applied on each rollback."""
    max_consecutive: int = Field(3, ge=1)
    """Stop with an error after this many rollbacks in a row."""
    snapshot_on_cpu: bool = True
    """Keep the in-memory rollback snapshot (model + optimizer state) in host memory."""
    snapshot_every: int = Field(1, ge=1)
    """Take the restore point every this many applied steps (1: a rollback loses no applied
    step; larger saves the copy's time on big models, a rollback then goes back up to K-1)."""


class AlgoSettings(BaseModel):
    """Everything about the regularized GRPO update."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    advantage: AdvantageSettings = AdvantageSettings()
    """Group-relative advantages."""
    loss: LossSettings = LossSettings()
    """Clipped surrogate, KL and aggregation."""
    regularizer: RegularizerSettings = RegularizerSettings()
    """Adaptive gradient-norm regularizer."""
    rollback: RollbackSettings = RollbackSettings()
    """Non-finite step handling."""
    returns: Literal["outcome", "per_turn"] = "outcome"
    """Episodes (env.name set): one group-normalised advantage per episode from its outcome
    reward (outcome, GRPO), or one per turn from the discounted return-to-go normalised at
    equal turn index (per_turn; see grpo_stream.algo.returns). Single-turn tasks: no effect."""
    gamma: float = Field(1.0, ge=0, le=1)
    """Discount of per-turn returns: G_t = r_t + gamma * G_{t+1}."""
    overlong: Literal["none", "mask", "soft"] = "none"
    """What a completion that runs into generator.max_tokens costs (grpo_stream.algo.overlong):
    nothing (none); truncated completions leave the loss, still counting in their group's
    mean and std (mask); or DAPO's soft overlong punishment added to the reward before
    advantages (soft): 0 up to max_tokens - overlong_buffer tokens, then falling linearly to
    -overlong_factor at max_tokens."""
    overlong_buffer: int = Field(4, ge=1)
    """overlong = soft: L_cache, the tokens before max_tokens over which the penalty grows
    (at most generator.max_tokens)."""
    overlong_factor: float = Field(1.0, gt=0)
    """overlong = soft: the penalty at max_tokens (DAPO: 1, the scale of a correct answer)."""
    distill: DistillSettings = DistillSettings()
    """On-policy distillation from a teacher model (off unless distill.teacher is set)."""

    @model_validator(mode="after")
    def _check(self) -> AlgoSettings:
        if self.loss.dual_clip is not None and self.loss.dual_clip <= 1 + self.loss.eps_high:
            raise ValueError("loss.dual_clip must exceed 1 + loss.eps_high")
        return self


def check_algo_config(algo: AlgoSettings, max_tokens: int, episodes: bool) -> None:
    """Cross-section checks of the update's settings (raised as one line naming the setting):
    `max_tokens` is generator.max_tokens, `episodes` whether env.name is set."""
    if algo.overlong == "soft" and algo.overlong_buffer > max_tokens:
        raise ValueError(
            f"algo.overlong_buffer ({algo.overlong_buffer}) must be at most "
            f"generator.max_tokens ({max_tokens}): it is the span before max_tokens over "
            "which the soft penalty grows"
        )
    if algo.overlong != "none" and episodes:
        raise ValueError(
            "algo.overlong applies to single-turn completions: set algo.overlong = 'none' "
            "with env.name (an episode's length is set by env.max_episode_tokens)"
        )
