"""Worker of the context-parallel tests: two gloo ranks of one context group.

Started by torch.multiprocessing.spawn from conftest.py (this directory is on the parent's
sys.path, which spawn hands to the children). Each rank runs the same micro-batches through
the group, for each model shape of `SHAPES`: packed rows and prompt rows, log-probs and
entropies, and the gradient of a fixed weighted sum of the log-probs (summed over the
group, as DDP's average of N-scaled gradients does); then a TrainBatch shared by the leader,
and the refusal of a model whose attention bypasses transformers' interface. Rank 0 saves
everything for the tests, which compute the same things whole in one process.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from grpo_stream.hub.batches import build_batch
from grpo_stream.hub.replay import Group
from grpo_stream.models.loading import enable_checkpointing
from grpo_stream.models.testing import tiny_qwen2
from grpo_stream.protocols.messages import SamplingParams, TrainBatch
from grpo_stream.training.batch import Tensors, to_tensors
from grpo_stream.training.context.attention import use_context_attention
from grpo_stream.training.context.check import use_context
from grpo_stream.training.context.forward import packed_logprobs, rows_logprobs
from grpo_stream.training.context.groups import ContextGroup, context_groups, share_batch
from grpo_stream.training.packing import micro_batches
from grpo_stream.training.prompts import shared_micro_batches

WORLD = 2
TEMPERATURE = 0.7
SHAPES: dict[str, dict[str, Any]] = {
    "gqa": {"heads": 4, "kv_heads": 2},  # key/value heads split over the ranks
    "kv_repeated": {"heads": 4, "kv_heads": 1},  # fewer key/value heads than ranks
    "checkpointed": {"heads": 2, "kv_heads": 2, "checkpointing": True},
}
"""Model shapes (tiny Qwen2, hidden 32, two layers) the forwards run on."""


def make_model(shape: dict[str, Any]) -> Any:
    """The tiny Qwen2 of `shape`, float32, train mode, seeded: the same on every rank."""
    heads, kv_heads = shape["heads"], shape["kv_heads"]
    model = tiny_qwen2(
        vocab=40,
        seed=3,
        hidden=32,
        layers=2,
        heads=heads,
        kv_heads=kv_heads,
        positions=256,
        train=True,
    )
    if shape.get("checkpointing"):
        enable_checkpointing(model)
    return model


def _group(gid: int, rng: np.random.Generator) -> Group:
    lengths = rng.integers(1, 12, size=3)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(offsets[-1])
    return Group(
        group_id=gid,
        policy_version=0,
        prompt_ids=rng.integers(1, 40, size=int(rng.integers(2, 7))).astype(np.int32),
        completion_ids=rng.integers(1, 40, size=n).astype(np.int32),
        completion_offsets=offsets,
        logprobs=(-rng.random(n) - 0.5).astype(np.float32),
        rewards=np.array([1, 0, 1], dtype=np.float32),
        advantages=np.array([1, -1, 1], dtype=np.float32),
        valid=np.ones(3, dtype=bool),
        sampling=SamplingParams(temperature=TEMPERATURE, top_p=1.0, max_tokens=12),
    )


def make_batch() -> TrainBatch:
    """Four groups of three completions of uneven lengths."""
    rng = np.random.default_rng(11)
    return build_batch(1, [_group(g, rng) for g in range(4)])


def micro_batch(layout: str) -> Tensors:
    """The batch as one micro-batch: packed rows (budget 64, so several rows and sequences
    per row, with padding) or prompt rows."""
    t = to_tensors(make_batch(), pad_id=0)
    if layout == "packed":
        return micro_batches(t, 64, 100, True, "sdpa", 0, rows=True)[0]
    parts = shared_micro_batches(t, 10_000, 100, 0, max_row=10_000)
    if parts is None or len(parts) != 1:
        raise RuntimeError("the prompt rows test expects one shared micro-batch")
    return parts[0]


def weights_like(values: torch.Tensor) -> torch.Tensor:
    """Fixed, uneven weights of a loss over log-probs of `values`' shape."""
    return torch.linspace(0.5, 2.0, values.numel()).view(values.shape)


def _split(model: Any, part: Tensors, ctx: ContextGroup) -> tuple[torch.Tensor, ...]:
    if part.prompts is not None:
        return rows_logprobs(model, part.prompts, ctx, TEMPERATURE, with_entropy=True)
    if part.packing is None:
        raise RuntimeError("a packed micro-batch without its rows")
    return packed_logprobs(model, part.packing, ctx, TEMPERATURE, with_entropy=True)


def run_forwards(ctx: ContextGroup) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, shape in SHAPES.items():
        for layout in ("packed", "rows"):
            model = make_model(shape)
            use_context_attention(model)
            logp, entropy = _split(model, micro_batch(layout), ctx)
            (logp * weights_like(logp)).sum().backward()
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
            for grad in grads.values():
                dist.all_reduce(grad, group=ctx.group)  # the group's parts add up
            out[f"{name}/{layout}"] = {"logp": logp.detach(), "entropy": entropy, "grads": grads}
    return out


class LocalAttention(torch.nn.Module):
    """A causal LM whose attention does not go through transformers' interface: it attends
    within whatever columns it is given (a user's model that context parallelism cannot
    split)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(
            num_attention_heads=2, vocab_size=40, _attn_implementation="sdpa"
        )
        self.embed = torch.nn.Embedding(40, 8)
        self.head = torch.nn.Linear(8, 40)

    def forward(self, input_ids: torch.Tensor, **_: Any) -> Any:
        x = self.embed(input_ids)  # (R, L, 8)
        mixed = torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)
        return SimpleNamespace(logits=self.head(mixed))


def run(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        ctx = context_groups(world, rank, world)
        results = run_forwards(ctx)
        polls: list[int] = []
        batch = make_batch() if ctx.leads else None
        results["shared"] = share_batch(ctx, batch, lambda: polls.append(1))
        results["after_stop"] = share_batch(ctx, None, lambda: polls.append(1))
        try:
            use_context(LocalAttention(), None, ctx, "local-attention")
            results["refused"] = ""
        except ValueError as exc:
            results["refused"] = str(exc)
        results["context"] = {"place": ctx.place, "leader": ctx.leader, "leads": ctx.leads}
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
