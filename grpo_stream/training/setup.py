"""Building a trainer's parts: this rank's device and process group, the policy (optionally
LoRA-wrapped, FSDP2-sharded or DDP-wrapped), its tokenizer, the reference model, the
optimizer and its lr schedule (`TrainState.create` assembles them, training/state.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import structlog
import torch
from torch.nn.parallel import DistributedDataParallel

from grpo_stream.collectives import init_distributed
from grpo_stream.config import RunConfig
from grpo_stream.models.loading import load_policy, load_tokenizer, prepare_training
from grpo_stream.training.bf16 import KahanAdamW
from grpo_stream.training.device import Mode, resolve
from grpo_stream.training.fsdp import shard_model
from grpo_stream.training.lora import AdapterDisabled, LoraPolicy, wrap_policy

log = structlog.get_logger()


def load_models(
    cfg: RunConfig, device: str, mode: str, ckpt: Path | None, sharded: bool
) -> tuple[Any, Any, Any, LoraPolicy | None]:
    """(policy, tokenizer, reference or None, LoRA or None) on `device` in precision `mode`:
    the policy from `ckpt` when resuming (LoRA: the base from the source, the adapter from
    ckpt), the reference (only with a KL term) always from the source."""
    source = cfg.model.name_or_path
    lora_on = cfg.trainer.lora.enabled  # LoRA: the base from source, the adapter from ckpt
    # the policy's master weights are float32 in every precision mode unless a dtype is
    # set explicitly ("auto" would mean bfloat16 weights on a GPU)
    dtype = "float32" if cfg.model.dtype == "auto" else cfg.model.dtype
    if mode == "bf16":
        dtype = "bfloat16"  # bf16 weights; KahanAdamW keeps the moments float32
    model = load_policy(
        str(ckpt) if ckpt and not lora_on else source,
        dtype=dtype,
        device=device,
        trainable=True,
    )
    prepare_training(model, cfg.trainer.dropout, cfg.trainer.gradient_checkpointing)
    lora = None
    if lora_on:
        model, lora = wrap_policy(model, cfg.trainer.lora, source, ckpt)
    if sharded:
        shard_model(model)  # before the optimizer, which must hold the DTensor parameters
    tokenizer = load_tokenizer(source)
    ref = None
    if cfg.algo.loss.beta > 0 and lora is not None:
        ref = AdapterDisabled(model)  # the base with the adapter off: no second copy
        log.info("lora.reference_shared", saved_mb=round(ref.saved_bytes / 2**20, 1))
    elif cfg.algo.loss.beta > 0:
        ref_dtype = "bfloat16" if mode == "bf16" else cfg.model.dtype
        ref = load_policy(source, dtype=ref_dtype, device=device, trainable=False)
    return model, tokenizer, ref, lora


FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
"""Parameter dtypes torch's fused AdamW takes."""


def make_optimizer(
    params: list[torch.Tensor], lr: float, weight_decay: float, mode: str, sharded: bool = False
) -> torch.optim.Optimizer:
    """AdamW; in bf16 mode KahanAdamW (float32 moments, compensated bf16 updates).

    Unsharded, AdamW runs fused (one vectorised pass per parameter: on the CPU 3-4x faster
    than the per-tensor loop, the same update); FSDP2's DTensor shards keep the default."""
    if mode == "bf16":
        return KahanAdamW(params, lr=lr, weight_decay=weight_decay)
    fused = not sharded and all(p.dtype in FUSED_DTYPES for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)


def start_rank(cfg: RunConfig) -> tuple[str, Mode, int, int]:
    """This rank's device (CUDA's current one when on a GPU) and precision mode, and its
    (rank, world) in the process group, started (grpo_stream/collectives.py)."""
    device, mode = resolve(cfg, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    rank, world = init_distributed(device)
    return device, mode, rank, world


def shards(cfg: RunConfig, world: int) -> bool:
    """Whether the policy is sharded with FSDP2 (trainer.parallel = fsdp2) over the process
    group: every rank's when there are several, and a world of one when the caller opened
    a process group itself (bench/gpu_scale.py measures FSDP2's own cost that way)."""
    dist = torch.distributed
    grouped = world > 1 or (dist.is_available() and dist.is_initialized())
    return grouped and cfg.trainer.parallel == "fsdp2"


def make_schedule(optimizer: torch.optim.Optimizer, warm: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A linear warm-up over `warm` steps (none when 0), then the optimizer's lr."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
    )


def wrap_ddp(model: Any, device: str, bucket_mb: float) -> DistributedDataParallel:
    """The policy under DDP, which all-reduces gradient buckets asynchronously while
    backward still runs."""
    ids = [torch.device(device).index] if device.startswith("cuda") else None
    return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_mb)
