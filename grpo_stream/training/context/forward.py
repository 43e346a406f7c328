"""The context-parallel forward of one micro-batch: log-probs of whole rows, N ranks each
running 1/N of the columns.

Every rank of the group holds the same micro-batch. Its rows are right-padded to W', a
multiple of N, and rank `place` runs columns [place * L, (place + 1) * L), L = W' / N,
through the model at their own position ids (RoPE sees the true positions), with
`ContextAttention` for what those columns attend to (training/context/attention.py). The
logits of a column predict the next token, so a token's log-prob is computed on the rank
that holds the column before it; each rank fills in the tokens its columns predict and one
all-reduce over the group gives every rank all of them (`_Gathered`).

Invariants:
- log-probs and entropies equal the whole-row forward's (packed rows: the sequences' own
  forwards; prompt rows: algo/grouped.py's) up to float rounding, in the same layouts the
  one-rank code returns ((R, W) packed, (S, C) prompt rows), 0 where those are 0;
- the loss that follows runs whole on every rank of the group; `_Gathered` passes each rank
  the gradient of the tokens it computed only, so every token is differentiated once, on
  its owner, and the group's summed parameter gradients are the whole loss's gradient
  (DDP and FSDP2 average over all ranks: the trainer scales its backward by N);
- padding columns (ids 0, position 0) are never read: no real column attends to them and no
  log-prob is taken from them.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_stream.algo.grouped import build_rows
from grpo_stream.algo.logprobs import next_token_logprobs
from grpo_stream.training.batch import Packing, SharedPrompts
from grpo_stream.training.context.attention import ContextAttention, Span
from grpo_stream.training.context.groups import ContextGroup


class _Gathered(torch.autograd.Function):
    """The sum over the group of each rank's values (M,), each entry nonzero on the one rank
    that computed it; backward hands this rank the gradient as is (its own entries are the
    only ones that depend on its parameters)."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, group: Any) -> torch.Tensor:
        out = values.clone()
        torch.distributed.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _gathered(values: torch.Tensor, ctx: ContextGroup) -> torch.Tensor:
    out: torch.Tensor = _Gathered.apply(values, ctx.group)  # type: ignore[no-untyped-call]
    return out


def padded_width(width: int, n: int) -> int:
    """The row width rounded up to a multiple of the N ranks."""
    return -(-width // n) * n


def _pad(x: torch.Tensor, width: int) -> torch.Tensor:
    """(R, W) -> (R, width) with zeros on the right."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


def sequence_spans(positions: torch.Tensor) -> tuple[Span, ...]:
    """Packed rows' sequences from their position ids (R, W): a sequence starts wherever a
    position does not follow the one before (as transformers finds packed sequences). A run
    of one-token spans (padding, one-token sequences: nothing reads their outputs) becomes
    one span. Rows with the same span share one attention call."""
    rows, width = positions.shape
    starts = torch.ones(positions.shape, dtype=torch.bool, device=positions.device)
    starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
    bounds: list[list[int]] = [[] for _ in range(rows)]
    for row, col in torch.nonzero(starts).cpu().tolist():
        bounds[row].append(col)
    by_span: dict[tuple[int, int], list[int]] = {}
    for row, cols in enumerate(bounds):
        merged: list[tuple[int, int, bool]] = []  # (start, end, a run of one-token spans)
        for lo, hi in zip(cols, [*cols[1:], width], strict=True):
            single = hi - lo == 1
            if single and merged and merged[-1][2]:
                merged[-1] = (merged[-1][0], hi, True)
            else:
                merged.append((lo, hi, single))
        for lo, hi, _ in merged:
            by_span.setdefault((lo, hi), []).append(row)
    device = positions.device
    return tuple(
        Span(lo, hi, None if len(members) == rows else torch.tensor(members, device=device))
        for (lo, hi), members in by_span.items()
    )


def _columns(ctx: ContextGroup, width: int) -> tuple[int, int]:
    """This rank's columns [lo, hi) of rows `width` wide (a multiple of N)."""
    length = width // ctx.size
    return ctx.place * length, (ctx.place + 1) * length


def _local_logits(
    model: Any,
    ids: torch.Tensor,
    positions: torch.Tensor,
    attention: ContextAttention,
    ctx: ContextGroup,
) -> torch.Tensor:
    """Logits (R, L, V) of this rank's columns of rows `ids`, `positions` (R, W')."""
    lo, hi = _columns(ctx, ids.shape[1])
    out = model(
        input_ids=ids[:, lo:hi],
        position_ids=positions[:, lo:hi],
        use_cache=False,
        context=attention,
    )
    logits: torch.Tensor = out.logits
    return logits


def packed_logprobs(
    model: Any, p: Packing, ctx: ContextGroup, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies (R, W) of packed rows, as `token_logprobs` gives them for the
    rows whole, on the completion tokens (`p.completion_mask`); 0 elsewhere."""
    rows, width = p.input_ids.shape
    wide = padded_width(width, ctx.size)
    ids, positions = _pad(p.input_ids, wide), _pad(p.position_ids, wide)
    attention = ContextAttention(ctx.group, ctx.size, sequence_spans(positions))
    logits = _local_logits(model, ids, positions, attention, ctx)  # (R, L, V)
    lo, hi = _columns(ctx, wide)
    targets = _pad(ids[:, 1:], wide)[:, lo:hi]  # column c predicts token c + 1
    logp, entropy = next_token_logprobs(logits, targets, temperature, with_entropy)  # (R, L)
    flat = torch.nonzero(p.completion_mask.reshape(-1)).squeeze(1)  # (M,) tokens to read
    row, col = flat // width, flat % width - 1  # the column whose logits predict each
    own = (col >= lo) & (col < hi)
    at = row[own] * (hi - lo) + col[own] - lo  # into this rank's (R, L)
    values = _gathered(_spread(logp.reshape(-1)[at], own), ctx)
    out = torch.zeros(rows * width, device=values.device).index_put((flat,), values)
    ent = torch.zeros_like(out)
    if entropy is not None:
        with torch.no_grad():
            ent[flat] = _gathered(_spread(entropy.reshape(-1)[at], own), ctx)
    return out.view(rows, width), ent.view(rows, width)


def rows_logprobs(
    model: Any, sp: SharedPrompts, ctx: ContextGroup, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies (S, C) of completions laid out as prompt rows
    (`algo.grouped.build_rows`), as `grouped_logprobs` gives them; 0 on padding."""
    rows = build_rows(sp)
    width = rows.input_ids.shape[1]
    wide = padded_width(width, ctx.size)
    allowed = torch.nn.functional.pad(rows.allowed, (0, wide - width, 0, wide - width))
    pads = torch.arange(width, wide, device=allowed.device)
    allowed[:, :, pads, pads] = True  # a padding column sees itself only
    attention = ContextAttention(ctx.group, ctx.size, (), allowed)
    ids, positions = _pad(rows.input_ids, wide), _pad(rows.position_ids, wide)
    logits = _local_logits(model, ids, positions, attention, ctx)  # (R, L, V)
    lo, hi = _columns(ctx, wide)
    valid = sp.completion_attn.bool()
    seq, step = torch.nonzero(valid, as_tuple=True)  # (M,) each completion token
    row, col = rows.row[seq], rows.column[seq, step]  # the column whose logits predict it
    own = (col >= lo) & (col < hi)
    picked = logits[row[own], col[own] - lo].unsqueeze(0)  # (1, m, V)
    target = sp.completion_ids[seq[own], step[own]].long().unsqueeze(0)
    logp, entropy = next_token_logprobs(picked, target, temperature, with_entropy)  # (1, m)
    values = _gathered(_spread(logp[0], own), ctx)
    out = torch.zeros(valid.shape, device=values.device).index_put((seq, step), values)
    ent = torch.zeros_like(out)
    if entropy is not None:
        with torch.no_grad():
            ent[seq, step] = _gathered(_spread(entropy[0], own), ctx)
    return out, ent


def _spread(mine: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """(M,) values of every token to read: this rank's `mine` where `own`, 0 elsewhere
    (the tokens other ranks compute)."""
    values = torch.zeros(own.shape[0], device=mine.device, dtype=mine.dtype)
    return values.index_put((torch.nonzero(own).squeeze(1),), mine)
