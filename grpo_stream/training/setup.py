"""Building a trainer's parts: the process group, the policy (optionally LoRA-wrapped or
FSDP2-sharded), its tokenizer, the reference model and the optimizer
(`TrainState.create` assembles them, training/state.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import structlog
import torch

from grpo_stream.config import RunConfig
from grpo_stream.training.lora import LoraPolicy

log = structlog.get_logger()


def load_models(
    cfg: RunConfig, device: str, mode: str, ckpt: Path | None, sharded: bool
) -> tuple[Any, Any, Any, LoraPolicy | None]:
    """(policy, tokenizer, reference or None, LoRA or None) on `device` in precision `mode`:
    the policy from `ckpt` when resuming (LoRA: the base from the source, the adapter from
    ckpt), the reference (only with a KL term) always from the source."""
    from grpo_stream.models.loading import load_policy, load_tokenizer, prepare_training

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
        from grpo_stream.training.lora import wrap_policy

        model, lora = wrap_policy(model, cfg.trainer.lora, source, ckpt)
    if sharded:
        from grpo_stream.training.fsdp import shard_model

        shard_model(model)  # before the optimizer, which must hold the DTensor parameters
    tokenizer = load_tokenizer(source)
    ref = None
    if cfg.algo.loss.beta > 0 and lora is not None:
        from grpo_stream.training.lora import AdapterDisabled

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
        from grpo_stream.training.bf16 import KahanAdamW

        return KahanAdamW(params, lr=lr, weight_decay=weight_decay)
    fused = not sharded and all(p.dtype in FUSED_DTYPES for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)


def init_distributed(backend: str = "gloo") -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; joins the process group if > 1
    (NCCL when the ranks' tensors are on GPUs, gloo on the CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dist = torch.distributed
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend)
    return rank, world
