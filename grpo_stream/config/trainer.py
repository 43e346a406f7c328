"""`trainer`: the optimizer, precision, ranks, publishing and checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grpo_stream.config.lora import LORA_LR, LoraSettings


class TrainerSettings(BaseModel):
    """The trainer."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    lr: float = Field(1e-4, gt=0)
    """AdamW learning rate. Not given and trainer.lora.enabled: models.adapter.LORA_LR (2e-3)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up steps, then constant."""
    micro_batch: int = Field(64, ge=1)
    """Most sequences in one micro-batch (an upper bound beside micro_batch_tokens);
    gradients accumulate over micro-batches."""
    micro_batch_tokens: int = Field(16384, ge=1)
    """Token budget of one micro-batch's forward: rows x row width, padding included. Must
    hold the longest sequence (prompt + generator.max_tokens)."""
    minibatches: int = Field(1, ge=1, le=64)
    """Optimizer updates per batch (PPO-style): the batch's rows are split into this many
    minibatches, one AdamW step each, with pi_prox fixed at the batch's start (so the tis /
    decoupled clip can bind from the second on); step, version and lr schedule still advance
    once per batch, and a rollback discards the whole batch (training/minibatches.py).
    Needs trainer.ranks = 1 when above 1."""
    packing: bool = True
    """Pack several sequences into each row, padding-free (position ids restart per sequence,
    attention stays within each); false right-pads one sequence per row."""
    share_prompts: bool = True
    """Run each distinct prompt of a micro-batch once (a GRPO group's G completions attend to
    its KV cache, with grad) and the LM head only where a completion token is predicted; the
    same log-probs and gradients as the full-sequence forward (training/prompts.py). Used on
    one rank (not under DDP / FSDP2) without gradient_checkpointing, sdpa or eager attention;
    otherwise, or when no prompt repeats, packing applies."""
    prompt_rows: bool = True
    """With share_prompts: run a micro-batch whose groups are short as rows, each prompt and
    all its completions in one row (short groups sharing a row) under a 4D attention mask:
    one forward, no KV cache. Applies when the dense attention over the widest row costs at
    most a quarter of the rest of the forward and the model passed a check at start
    (algo/grouped.py); else, or false, the completions run on the prompt's KV cache."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them
    (transformers' activation checkpointing, non-reentrant): less memory, more compute."""
    dropout: bool = False
    """Keep the model's dropout active in the training forward; off, the log-probs trained on
    are those of the deterministic policy that the generators sample."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the policy, reference, optimizer state and batches live: auto is cuda:LOCAL_RANK
    when CUDA is visible, else cpu."""
    precision: Literal["auto", "fp32", "bf16-mixed", "fp16-mixed", "bf16"] = "auto"
    """fp32; bf16-mixed (fp32 weights, bf16 autocast); fp16-mixed (fp16 autocast with a
    gradient scaler: an overflow skips the step); bf16 (bf16 weights, fp32 moments, Kahan-
    compensated updates: training/bf16.py). auto: bf16-mixed on GPUs, fp32 on CPU."""
    publish_every: int = Field(1, ge=1)
    """Publish new weights every this many steps."""
    checkpoint_every: int = Field(50, ge=1)
    """Write a checkpoint every this many steps (and at shutdown)."""
    keep_checkpoints: int = Field(2, ge=1)
    """Complete checkpoints kept on disk."""
    ranks: int = Field(1, ge=1)
    """torch.distributed ranks (torchrun) for the trainer."""
    devices: list[int] = []
    """run.placement = manual or colocated: NVML indices of the trainer's GPUs, one per rank."""
    rendezvous_port: int = Field(29500, ge=1, le=65535)
    """Trainer ranks on several hosts: torchrun's rendezvous port on the first trainer host."""
    rendezvous_timeout_s: float = Field(120.0, gt=0)
    """Trainer ranks on several hosts: how long a node waits to reach the rendezvous."""
    ddp_bucket_mb: float = Field(25.0, gt=0)
    """DDP gradient bucket size: buckets are all-reduced while backward still runs."""
    parallel: Literal["ddp", "fsdp2"] = "ddp"
    """How several ranks share the model: ddp replicates it and all-reduces gradient buckets;
    fsdp2 shards parameters, gradients and optimizer state per decoder layer (for models
    that do not fit one device)."""
    context_parallel: int = Field(1, ge=1)
    """Context parallelism: each sequence is split over this many trainer ranks, each
    holding 1/N of its tokens and activations (Ulysses: every attention layer trades tokens
    for heads with all-to-alls; exact). trainer.ranks must be a multiple: the ranks form
    trainer.ranks / N groups of N, each training its shard of the step (DDP or FSDP2 across
    all ranks). N must divide the model's attention heads. micro_batch_tokens counts whole
    rows: each rank holds about micro_batch_tokens / N of them (guide: long sequences)."""
    bind: str = "tcp://127.0.0.1:0"
    """Address of the weight server (ROUTER) and announcer (PUB uses the next port)."""
    announce_bind: str | None = None
    """Address of the weights announcer (PUB); None binds a free port on the bind host."""
    public_host: str | None = None
    """Host other machines use to reach the trainer (defaults to the bound host)."""
    fault_nan_step: int | None = None
    """Test hook: inject a NaN into the loss at this step to exercise rollback."""
    throttle_s: float = Field(0.0, ge=0)
    """Test hook: sleep this long after each applied step (a trainer slower than its
    generators, which then run ahead to the staleness gate); tests that kill a service mid-run
    use it so the run cannot end before the kill, however fast a step gets."""
    lora: LoraSettings = LoraSettings()
    """LoRA: train and publish a peft adapter instead of all weights."""

    @model_validator(mode="after")
    def _minibatches_one_rank(self) -> TrainerSettings:
        if self.minibatches > 1 and self.ranks > 1:
            raise ValueError(
                "trainer.minibatches > 1 needs trainer.ranks = 1 (each minibatch's loss "
                "normalisers are not summed across ranks)"
            )
        return self

    @model_validator(mode="after")
    def _context_divides_ranks(self) -> TrainerSettings:
        if self.ranks % self.context_parallel:
            raise ValueError(
                f"trainer.context_parallel = {self.context_parallel} must divide trainer.ranks "
                f"= {self.ranks}: each sequence is split over that many of the trainer's ranks"
            )
        if self.micro_batch_tokens < self.context_parallel:
            raise ValueError(
                f"trainer.micro_batch_tokens = {self.micro_batch_tokens} is shorter than "
                f"trainer.context_parallel = {self.context_parallel}: every rank must hold at "
                "least one token of a row"
            )
        return self

    @property
    def data_ranks(self) -> int:
        """Data-parallel groups: ranks that train different sequences (trainer.ranks over
        trainer.context_parallel); the hub splits each step this many ways."""
        return self.ranks // self.context_parallel

    @model_validator(mode="after")
    def _lora_lr(self) -> TrainerSettings:
        """LoRA needs a higher lr than full fine-tuning: LORA_LR unless trainer.lr is given."""
        if self.lora.enabled and "lr" not in self.model_fields_set:
            self.lr = LORA_LR
        return self


def check_context_heads(degree: int, heads: int, model: str) -> None:
    """Ulysses hands each of the `degree` context-parallel ranks heads / degree attention
    heads: refuse a degree that does not divide `heads` (ValueError, one line)."""
    if degree > 1 and heads % degree:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        raise ValueError(
            f"trainer.context_parallel = {degree} does not divide the {heads} attention heads "
            f"of {model}: each rank attends with heads / context_parallel of them; choose one "
            f"of {divisors}"
        )
