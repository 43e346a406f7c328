"""The trainer's state and its regularized GRPO update step.

One step: TrainBatch -> padded tensors -> for each micro-batch: token log-probs (with grad),
GRPO loss normalised by the whole batch's totals, backward (gradients accumulate) ->
rollback guard check -> gradient regularizer (global norm) -> AdamW step -> version + 1 ->
restore point (every rollback.snapshot_every steps). With a weighted algo.loss.off_policy
(tis, decoupled, icepop, seq_tis) each micro-batch first gets pi_prox, a no-grad forward
(training/offpolicy.py).
A non-finite loss, gradient or norm, or an exploding norm, skips the optimizer step and
restores the last snapshot; when that goes back past applied steps the version still grows
(the restored weights are a new version, to publish: `StepResult.republish`).

Several ranks (torchrun) either replicate the model under DDP or shard it with FSDP2
(`trainer.parallel`, see grpo_stream.training.fsdp). Under FSDP2 `checkpoint` and
`named_weights` are collective: every rank calls them at the same points. With
`trainer.context_parallel = N` each N ranks split every sequence of their shard
(grpo_stream.training.context): every forward runs through the group, the backward is
scaled by N and the loss normalisers count the data-parallel groups.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import torch

from grpo_stream.algo.grouped import rows_width, rows_work
from grpo_stream.algo.logprobs import shared_prompts_supported
from grpo_stream.algo.loss import grpo_loss
from grpo_stream.algo.regularizer import GradRegularizer
from grpo_stream.algo.rollback import RollbackGuard
from grpo_stream.config import RunConfig
from grpo_stream.protocols.messages import SamplingParams, TrainBatch
from grpo_stream.training.batch import Tensors, to_tensors
from grpo_stream.training.checkpoint import (
    gather_trainer_state,
    restore_trainer_state,
    resume_point,
    save_checkpoint,
)
from grpo_stream.training.context.check import use_context
from grpo_stream.training.context.groups import ContextGroup, context_groups
from grpo_stream.training.fsdp import full_model_state, max_over_ranks
from grpo_stream.training.lora import LoraPolicy
from grpo_stream.training.minibatches import merge, own_totals, shard_totals, split_rows
from grpo_stream.training.offpolicy import (
    OffPolicyMeter,
    deterministic_forward,
    proximal_logprobs,
)
from grpo_stream.training.packing import (
    plan_micro_batches,
    reference_logprobs,
    sequence_logprobs,
)
from grpo_stream.training.precision import Precision
from grpo_stream.training.setup import (
    load_models,
    make_optimizer,
    make_schedule,
    shards,
    start_rank,
    wrap_ddp,
)
from grpo_stream.training.staging import HostStaging

log = structlog.get_logger()


@dataclass
class StepResult:
    applied: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    republish: bool = False  # a rollback restored older weights as a new version


@dataclass
class TrainState:
    """Policy, reference, optimizer, schedule, regularizer, guard, step and version."""

    cfg: RunConfig
    model: Any
    tokenizer: Any
    ref_model: Any
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    regularizer: GradRegularizer
    guard: RollbackGuard
    step: int = 0
    version: int = 0
    ddp: Any = None  # DistributedDataParallel wrapper when several ranks train under DDP
    fsdp: bool = False  # the model is sharded with FSDP2 (its parameters are DTensors)
    world_size: int = 1
    rank: int = 0
    fault_fired: bool = False
    lora: LoraPolicy | None = None  # with trainer.lora.enabled (the model is then peft's)
    meter: OffPolicyMeter = field(default_factory=OffPolicyMeter)  # this step's IS metrics
    device: str = "cpu"  # where the policy, reference, optimizer state and batches live
    precision: Precision = field(default_factory=lambda: Precision("fp32", "cpu"))
    staging: HostStaging | None = None  # pinned device -> host buffer for publishing (GPU)
    layout: str = ""  # the last step's micro-batch layout: rows, shared, packed or padded
    rows_ok: bool = False  # trainer.prompt_rows applies: the model passed grouped.rows_work
    context: ContextGroup | None = None  # trainer.context_parallel > 1: this rank's group

    @classmethod
    def create(cls, cfg: RunConfig, resume: bool = False) -> TrainState:
        torch.manual_seed(cfg.run.seed)
        device, mode, rank, world = start_rank(cfg)
        sharded = shards(cfg, world)
        # rank 0's checkpoint; a rank without its own copy gets its state from rank 0
        weights, ckpt, sent = resume_point(Path(cfg.run.run_dir), resume, rank, world, sharded)
        model, tokenizer, ref, lora = load_models(cfg, device, mode, weights, sharded)
        t = cfg.trainer
        trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapter only
        optimizer = make_optimizer(trainable, t.lr, t.weight_decay, mode, sharded)
        scheduler = make_schedule(optimizer, t.warmup_steps)
        # Under DDP the gradients are already all-reduced (identical on every rank), so the
        # regularizer's norm must not sum over ranks again; FSDP2 shards must be summed.
        regularizer = GradRegularizer(cfg.algo.regularizer, sharded=world == 1 or sharded)
        guard = RollbackGuard(cfg.algo.rollback)
        state = cls(cfg, model, tokenizer, ref, optimizer, scheduler, regularizer, guard)
        state.world_size, state.rank, state.fsdp, state.lora = world, rank, sharded, lora
        state.device, state.precision = device, Precision(mode, device)
        if device.startswith("cuda"):
            state.staging = HostStaging(pin=True)
        log.info("trainer.device", device=device, precision=mode, world=world)
        if ckpt is not None:
            restore_trainer_state(state, ckpt, sent)
        if t.context_parallel > 1:  # every rank holds the same weights by now
            state.context = context_groups(t.context_parallel, rank, world)
            use_context(model, ref, state.context, cfg.model.name_or_path)
        if world > 1 and not sharded:
            state.ddp = wrap_ddp(model, device, t.ddp_bucket_mb)
        if state.context is not None:  # rows run through the group's attention, checked
            state.rows_ok = t.prompt_rows
        elif t.prompt_rows and state._shares_prompts(str(model.config._attn_implementation)):
            state.rows_ok = rows_work(model)
            log.info("trainer.prompt_rows", works=state.rows_ok)
        state.guard.snapshot(state, state.step)
        return state

    def checkpoint(self) -> Path | None:
        """Every rank calls this: each takes a new rollback snapshot (of its own shard under
        FSDP2) and joins gathering the full weights and optimizer state; rank 0 writes."""
        self.guard.snapshot(self, self.step)
        weights, state = gather_trainer_state(self)
        if self.rank != 0:
            return None
        path = save_checkpoint(
            Path(self.cfg.run.run_dir),
            self.step,
            self.model,
            self.tokenizer,
            state,
            self.cfg.trainer.keep_checkpoints,
            model_state=weights,
        )
        log.info("checkpoint.saved", step=self.step, path=str(path))
        return path

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights to publish. Under FSDP2 this is collective and gathers when called
        (not when iterated): every rank calls it at the same point, rank 0 gets the tensors
        and the other ranks nothing."""
        if self.fsdp:
            return iter(full_model_state(self.model).items())
        if self.lora is not None:
            weights = self.lora.named_weights(self.model)  # the adapter and its manifest only
        else:
            weights = iter(self.model.state_dict().items())
        return weights if self.staging is None else self.staging.stage(weights)

    # ----- the update -------------------------------------------------------------------
    def train_step(self, batch: TrainBatch) -> StepResult:
        tensors = to_tensors(batch, pad_id=self._pad_id())
        if tensors.size == 0:
            log.warning("trainer.empty_batch", step=self.step)
            return StepResult(applied=False)
        self.meter = OffPolicyMeter(self.cfg.algo.loss.is_cap)
        minis = split_rows(tensors, self.cfg.trainer.minibatches)  # training/minibatches.py
        prox = self._proximal(minis, batch.sampling) if len(minis) > 1 else [None]
        updates: list[tuple[dict[str, Any], float]] = []
        for mini, mini_prox in zip(minis, prox, strict=True):
            totals = None if len(minis) == 1 else own_totals(mini)
            out = self._update(mini, batch, totals, mini_prox)
            if isinstance(out, StepResult):  # rolled back: the whole batch is discarded
                return out
            if out is not None:  # None: an fp16 overflow skipped this update
                updates.append((out, float(mini.completion_mask.sum())))
        if not updates:
            return StepResult(False, {"overflow_skips": self.precision.overflow_skips})
        self.scheduler.step()
        for group in self.optimizer.param_groups:  # keep rollback's lr reductions
            group["lr"] *= self.guard.lr_scale
        self.guard.stable()
        self.step += 1
        self.version += 1
        self.guard.after_step(self, self.step)
        metrics = merge(updates)
        metrics.update(self.meter.summary())
        metrics.update(
            lr=float(self.optimizer.param_groups[0]["lr"]),
            rollbacks=self.guard.total,
            explosions=self.guard.explosions,
            overflow_skips=self.precision.overflow_skips,
            layout=self.layout,
        )
        return StepResult(applied=True, metrics=metrics)

    def _update(
        self,
        t: Tensors,
        batch: TrainBatch,
        totals: tuple[float, float] | None,
        prox: list[torch.Tensor] | None,
    ) -> dict[str, Any] | StepResult | None:
        """One optimizer step on `t` (the batch, or one of its minibatches): its metrics; a
        StepResult when it rolled back; None when an fp16 overflow skipped it."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer.zero_grad(set_to_none=True)
        loss, metrics = self._forward_backward(t, batch, totals, prox)
        if not self.precision.unscale(self.optimizer, params):  # fp16 overflow: skip, no rollback
            self.precision.skip()
            return None
        if not self.guard.check(loss, params):
            return self._rollback(self.guard.last_cause or "")
        reg = self.regularizer.apply(params)
        if reg.skip is not None:
            return self._rollback(reg.skip, grad_norm=reg.norm_before, tau=reg.tau)
        self.guard.before_update()  # an overlapped restore point still reading the weights
        self.precision.step(self.optimizer)
        metrics.update(
            loss=float(loss),
            grad_norm=reg.norm_before,
            grad_norm_after=reg.norm_after,
            tau=reg.tau,
            reg_fired=reg.fired,
            reg_fired_frac=reg.fired_frac,
        )
        return metrics

    def _proximal(
        self, minis: list[Tensors], sampling: SamplingParams
    ) -> list[list[torch.Tensor] | None]:
        """pi_prox of every minibatch's micro-batches (in `_micro_batches`' order), under the
        weights as they are now, before any update of the batch; None each when the loss
        needs none (off_policy behaviour | none)."""
        settings = self.cfg.algo.loss
        if not settings.weighted:
            return [None] * len(minis)
        out: list[list[torch.Tensor] | None] = []
        for mini in minis:
            parts = self._micro_batches(mini)
            with self.precision.autocast():
                out.append(
                    [
                        proximal_logprobs(
                            self.model,
                            part,
                            settings.chunk_for(part.forward_shape[1], self.vocab_size()),
                            sampling.temperature,
                            self.context,
                        )
                        for part in parts
                    ]
                )
        return out

    def _rollback(self, cause: str, **fields: float) -> StepResult:
        """Skip this step and restore the last snapshot (see algo/rollback.py)."""
        self.guard.rollback(self, self.step, cause)
        if self.guard.restores_weights:
            self.version += 1  # older weights, a new version: rollouts of newer ones go stale
        return StepResult(
            applied=False,
            metrics={"rollback_cause": cause, **fields},
            republish=self.guard.restores_weights,
        )

    def vocab_size(self) -> int:
        """Rows of the input embedding: a token id at or past it cannot be trained."""
        return int(self.model.config.vocab_size)

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id or 0)

    def _totals(self, t: Tensors, batch: TrainBatch) -> tuple[float, float]:
        """Loss normalisers of this rank's shard (`minibatches.shard_totals`): the step
        is split over the data-parallel groups (the ranks of a context group share one)."""
        groups = self.world_size // (self.context.size if self.context else 1)
        return shard_totals(t, batch.step, batch.totals, groups)

    def _forward_backward(
        self,
        t: Tensors,
        batch: TrainBatch,
        totals: tuple[float, float] | None = None,
        prox: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Accumulate gradients over micro-batches; returns the full-batch loss and metrics.
        A minibatch passes its own `totals` and its micro-batches' precomputed pi_prox."""
        totals = self._totals(t, batch) if totals is None else totals
        total = torch.zeros((), device=self.device)
        sums: dict[str, float] = {}
        parts = self._micro_batches(t)
        # a context group's N ranks each hold a part of the gradient, which DDP and FSDP2
        # average as if each were a replica: scaled by N, the average adds the parts up
        scale = float(self.context.size) if self.context is not None else 1.0
        for i in range(self._passes(len(parts))):
            part = parts[min(i, len(parts) - 1)]
            # under DDP, gradients are all-reduced on the last micro-batch only
            last = i >= len(parts) - 1
            sync = (
                self.ddp.no_sync()
                if self.ddp is not None and not last
                else contextlib.nullcontext()
            )
            with sync:
                with self.precision.autocast():  # log-probs and loss stay float32 inside
                    part_prox = None if prox is None else prox[min(i, len(prox) - 1)]
                    loss, m = self._micro_loss(
                        part, totals, batch.sampling, first=i == 0, prox=part_prox
                    )
                if i >= len(parts):  # FSDP2 filler pass (see _passes): no gradient, no metrics
                    self.precision.backward(loss * 0.0)
                    continue
                self.precision.backward(loss * scale)
            total = total + loss.detach()
            weight = float(m.get("num_tokens", 0.0))
            for k, v in m.items():
                if k != "num_tokens" and math.isfinite(v):
                    sums[k] = sums.get(k, 0.0) + v * weight
        local_tokens = float(t.completion_mask.sum())
        metrics = {k: v / max(local_tokens, 1.0) for k, v in sums.items()}
        metrics.setdefault("kl", 0.0)
        return total, metrics

    def _micro_batches(self, t: Tensors) -> list[Tensors]:
        """The step's token-budget micro-batches (`packing.plan_micro_batches`), on the
        device; their layout is kept for the step's metrics."""
        impl = str(self.model.config._attn_implementation)
        share = self._shares_prompts(impl)
        context = self.context is not None
        parts, self.layout = plan_micro_batches(
            t, self.cfg.trainer, impl, self._pad_id(), share, self._max_row(share), context
        )
        return [part.to(self.device) for part in parts]

    def _max_row(self, share: bool) -> int:
        """The widest shared-prompt row that runs as rows (trainer.prompt_rows): `rows_width`
        of the model when it passed `rows_work` at start, else 0 (none)."""
        return rows_width(self.model.config) if share and self.rows_ok else 0

    def _shares_prompts(self, attn_implementation: str) -> bool:
        """trainer.share_prompts applies: one rank (DDP's reducer and FSDP2's collectives
        expect one forward per backward; a shared-prompt micro-batch runs two), no activation
        checkpointing (transformers drops the KV cache under it), sdpa or eager attention.
        Under context parallelism: as prompt rows only (one forward, through the group)."""
        s = self.cfg.trainer
        if self.context is not None:
            return s.share_prompts and s.prompt_rows
        return (
            s.share_prompts
            and self.ddp is None
            and not self.fsdp
            and not s.gradient_checkpointing
            and attn_implementation in ("sdpa", "eager")
            and shared_prompts_supported(self.model)
        )

    def _passes(self, micro_batches: int) -> int:
        """Passes this rank runs. Under FSDP2 each is collective (all-gathers, and a gradient
        reduce-scatter: accumulating unsharded would need full gradients on every rank), so
        a rank with fewer micro-batches repeats its last at zero weight to match the rest."""
        if not self.fsdp:
            return micro_batches
        return max_over_ranks(micro_batches)

    def _micro_loss(
        self,
        part: Tensors,
        totals: tuple[float, float],
        sampling: SamplingParams,
        first: bool,
        prox: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        settings = self.cfg.algo.loss
        model = self.ddp if self.ddp is not None else self.model
        # One forward per micro-batch under DDP (its reducer expects forward, then backward)
        # and FSDP2 (every forward is collective; the ranks' chunk counts could differ).
        rows, width = part.forward_shape
        whole = self.ddp is not None or self.fsdp
        chunk = rows if whole else settings.chunk_for(width, self.vocab_size())
        temperature = sampling.temperature  # the data's: log-probs of the sampled distribution
        # pi_prox: the weights at the start of the step, no grad (minibatches pass theirs);
        # with a deterministic forward it is this forward's own values (offpolicy.py)
        wants = prox is None and settings.weighted
        if wants and not deterministic_forward(self.cfg):
            prox = proximal_logprobs(self.model, part, chunk, temperature, self.context)
        logp, entropy = sequence_logprobs(model, part, chunk, temperature, True, self.context)
        if wants and prox is None:
            prox = logp.detach()
        self.meter.add(logp.detach() if prox is None else prox, part, self.version)
        ref_logp = None
        if self.ref_model is not None:
            ref_chunk = settings.chunk_for(width, self.vocab_size())
            ref_logp = reference_logprobs(
                self.ref_model, part, ref_chunk, temperature, self.context
            )
        loss, m = grpo_loss(
            logp,
            part.old_logp,
            part.loss_advantages,
            part.completion_mask,
            settings,
            ref_logp=ref_logp,
            max_tokens=sampling.max_tokens,
            trainer_old_logp=prox,
            entropy=entropy,
            num_seqs_total=totals[0],
            num_tokens_total=totals[1],
        )
        if self.cfg.trainer.fault_nan_step == self.step and first and not self.fault_fired:
            self.fault_fired = True
            loss = loss * float("nan")  # test hook: exercise the rollback path once
        return loss, m
