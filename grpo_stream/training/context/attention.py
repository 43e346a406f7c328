"""Ulysses attention: each layer trades a slice of the sequence for a slice of the heads.

A context-parallel rank holds columns [place * L, (place + 1) * L) of every row (L = W / N)
and all of its heads. Attention needs every column, so one all-to-all sends each rank's
queries, keys and values of head group j to rank j and gathers, on this rank, its head
group for every column: (R, H, L, D) -> (R, H / N, W, D). Attention then runs whole for
those heads, and a second all-to-all sends the output back: (R, H / N, W, D) ->
(R, H, L, D). Everything else in a layer (projections, RoPE at the given position ids,
norms, the MLP) works token by token and runs on the rank's own columns. Backward is the
same exchange in reverse (an all-to-all is its own adjoint).

What a row's columns may attend to is given whole (`ContextAttention`): for packed rows,
the spans of their sequences (each span causal within itself, one attention call per span,
no mask); for prompt rows (algo/grouped.py), their 4D mask. Keys and values with fewer
heads than the queries (GQA) travel as they are when N divides their heads, else repeated
to the query heads first.

Invariants:
- `context_attention` is called by the model's attention modules (transformers'
  attention interface, registered as `ATTENTION` by `use_context_attention`) with the
  `context` keyword that `training.context.forward` passes to the model; a call without it
  is an error, never a silent local attention;
- every rank of the group calls it for the same layers in the same order (the group's
  forwards, and their recomputation under activation checkpointing, are the same);
- sliding windows, soft-capping and attention sinks are refused (one line), not ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

ATTENTION = "grpo_stream_context"
"""The name the context-parallel attention is registered under (transformers'
AttentionInterface) and set as the policy's (and reference's) attention implementation."""


@dataclass(frozen=True)
class Span:
    """Columns [start, end) of some rows attend causally within themselves."""

    start: int
    end: int
    rows: torch.Tensor | None  # (r,) long on the device; None: every row


@dataclass(frozen=True)
class ContextAttention:
    """What one forward's attention needs beyond its own columns (the `context` keyword)."""

    group: Any  # the context-parallel process group
    size: int  # N
    spans: tuple[Span, ...]  # packed rows: every column of every row in exactly one span
    allowed: torch.Tensor | None = None  # (R, 1, W, W) bool: prompt rows' mask (then no spans)


class _Exchange(torch.autograd.Function):
    """all_to_all over dim 0 of a (N, ...) tensor: block j goes to rank j, block j of the
    result came from rank j. Its own adjoint, so backward exchanges the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _all_to_all(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_to_all(grad, ctx.group), None


def _exchange(x: torch.Tensor, group: Any) -> torch.Tensor:
    out: torch.Tensor = _Exchange.apply(x, group)  # type: ignore[no-untyped-call]
    return out


def _all_to_all(x: torch.Tensor, group: Any) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    torch.distributed.all_to_all_single(out, x, group=group)
    return out


def heads_for_sequence(x: torch.Tensor, group: Any, n: int) -> torch.Tensor:
    """(R, H, L, D) of this rank's columns -> (R, H / N, N * L, D) of its head group."""
    rows, heads, length, dim = x.shape
    blocks = x.view(rows, n, heads // n, length, dim).transpose(0, 1)  # (N, R, H/N, L, D)
    got = _exchange(blocks, group)  # block j: rank j's columns
    return got.permute(1, 2, 0, 3, 4).reshape(rows, heads // n, n * length, dim)


def sequence_for_heads(y: torch.Tensor, group: Any, n: int) -> torch.Tensor:
    """(R, H / N, W, D) of this rank's head group -> (R, H, W / N, D) of its columns."""
    rows, part, width, dim = y.shape
    blocks = y.view(rows, part, n, width // n, dim).permute(2, 0, 1, 3, 4)  # (N, R, H/N, L, D)
    got = _exchange(blocks, group)  # block j: rank j's head group
    return got.transpose(0, 1).reshape(rows, n * part, width // n, dim)


def context_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    context: ContextAttention | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: `query` (R, H, L, D), `key`/`value` (R, KV, L, D)
    of this rank's columns -> output (R, L, H, D). `attention_mask` is ignored (the model
    built it from this rank's columns only): `context` says what attends to what."""
    if context is None:
        raise RuntimeError(
            "a forward under trainer.context_parallel without its context (the trainer's "
            "training.context.forward passes it): this model cannot run outside it"
        )
    _refuse_unsupported(kwargs)
    n, group = context.size, context.group
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads % n:  # GQA with fewer key/value heads than ranks: repeat them to the queries'
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    q = heads_for_sequence(query, group, n)  # (R, H/N, W, D)
    k = heads_for_sequence(key, group, n)  # (R, KV/N, W, D)
    v = heads_for_sequence(value, group, n)
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    out = _attend(q, k, v, context, dropout, scaling)  # (R, H/N, W, D)
    return sequence_for_heads(out, group, n).transpose(1, 2).contiguous(), None


def _refuse_unsupported(kwargs: dict[str, Any]) -> None:
    for name in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(
                f"trainer.context_parallel: this model's attention uses {name}, which context "
                "parallelism does not implement; set trainer.context_parallel = 1"
            )


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context: ContextAttention,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """Attention over whole rows: under the prompt rows' mask, or causal within each span."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if context.allowed is not None:
        return sdpa(q, k, v, attn_mask=context.allowed, dropout_p=dropout, scale=scaling)
    out = torch.empty_like(q)
    for span in context.spans:
        cols = slice(span.start, span.end)
        if span.rows is None:  # every row: views, no copies
            sq, sk, sv = q[:, :, cols], k[:, :, cols], v[:, :, cols]
        else:
            sq, sk, sv = (t.index_select(0, span.rows)[:, :, cols] for t in (q, k, v))
        got = sdpa(sq, sk, sv, dropout_p=dropout, is_causal=True, scale=scaling)
        if span.rows is None:
            out[:, :, cols] = got
        else:
            out[span.rows, :, cols] = got
    return out


def use_context_attention(model: Any) -> None:
    """Register `context_attention` (once per process) and make it `model`'s attention."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, context_attention)
    model.config._attn_implementation = ATTENTION
