"""What the trainer checks before it splits sequences: the model's heads divide among the
ranks, and the model really attends through the context-parallel attention.

`use_context` is collective over the trainer's ranks (every rank calls it at start, after
the policy is loaded and sharded, before DDP wraps it). Its check runs two packed sequences
through the model twice, no grad: whole, with the model's own attention, and split over the
group; a model whose attention does not go through transformers' attention interface (or
that rebuilds positions of its own) gives other log-probs, and is refused in one line
instead of training on attention confined to each rank's columns.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_stream.algo.logprobs import token_logprobs
from grpo_stream.config.trainer import check_context_heads
from grpo_stream.training.batch import Packing
from grpo_stream.training.context.attention import use_context_attention
from grpo_stream.training.context.forward import packed_logprobs
from grpo_stream.training.context.groups import ContextGroup


def use_context(model: Any, ref: Any, ctx: ContextGroup, name: str) -> None:
    """Make `model` (and `ref`, a separate reference model, if any) attend through the
    group; ValueError (one line naming trainer.context_parallel) if it cannot."""
    check_context_heads(ctx.size, int(model.config.num_attention_heads), name)
    own = str(model.config._attn_implementation)
    use_context_attention(model)
    if not context_matches(model, ctx, own):
        raise ValueError(
            f"trainer.context_parallel = {ctx.size}: {name} gives other log-probs split over "
            "the ranks than whole (its attention does not go through transformers' attention "
            "interface); set trainer.context_parallel = 1"
        )
    if ref is not None and hasattr(ref, "config") and ref is not model:
        use_context_attention(ref)


def context_matches(model: Any, ctx: ContextGroup, own: str) -> bool:
    """Two packed sequences' log-probs, split over the group, against the whole forward
    with the model's own attention `own` (no grad, eval mode)."""
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    lengths = (3 * ctx.size + 1, 2 * ctx.size)
    width = sum(lengths)
    ids = torch.tensor([[(7 * k + 3) % (vocab - 1) + 1 for k in range(width)]], device=device)
    positions = torch.cat([torch.arange(n, device=device) for n in lengths]).unsqueeze(0)
    mask = positions > 0  # every token after a sequence's first
    packing = Packing(ids, positions, mask, torch.zeros(1, 1, dtype=torch.long, device=device))
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            split, _ = packed_logprobs(model, packing, ctx, 1.0, with_entropy=False)
            model.config._attn_implementation = own
            try:
                whole, _ = token_logprobs(
                    model, ids, None, mask, 1, with_entropy=False, position_ids=positions
                )
            finally:
                use_context_attention(model)
    finally:
        model.train(training)
    exact = next(model.parameters()).dtype == torch.float32
    tol = 1e-3 if exact else 2e-2  # bf16 / fp16: two kernels' rounding differs more
    return bool(torch.allclose(split.float(), whole.float(), atol=tol, rtol=tol))
