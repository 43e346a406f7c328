"""Token-budget micro-batches, with several sequences packed into each row.

A step's sequences (training/batch.py `Tensors`, one sequence per row) are split into
micro-batches whose forward holds at most `trainer.micro_batch_tokens` token slots (rows x
row width, padding included) and at most `trainer.micro_batch` sequences.

- packed (`trainer.packing`, the default): sequences are placed first-fit-decreasing into
  rows of width W. In a row the position ids restart at 0 for each sequence and the forward
  gets no attention mask: transformers then finds the sequences from the position ids and
  confines attention to each (a block-diagonal mask for sdpa and eager, varlen kernels for
  flash-attention). W is the step's longest sequence for sdpa and eager, whose mask is dense
  (W x W per row), and the whole budget for flash-attention (one flattened row).
- padded: one sequence per row in batch order, right-padded, with an attention mask.

Invariants:
- every sequence of the step is in exactly one micro-batch, and each micro-batch keeps its
  per-sequence tensors ((S, T), the layout the loss reads), so the loss and its gradients
  equal the padded computation's (tests/unit/training/test_packing.py);
- the first token of a sequence is never a completion token (a prompt has >= 1 token), so no
  log-prob is ever read across a sequence boundary inside a row;
- a sequence longer than the budget is an error naming `trainer.micro_batch_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from grpo_stream.algo.bins import first_fit_rows
from grpo_stream.algo.logprobs import token_logprobs
from grpo_stream.config.trainer import TrainerSettings
from grpo_stream.training.batch import Packing, Tensors
from grpo_stream.training.context.attention import ATTENTION
from grpo_stream.training.context.forward import packed_logprobs
from grpo_stream.training.context.groups import ContextGroup
from grpo_stream.training.prompts import shared_logprobs, shared_micro_batches

Rows = list[list[int]]
"""Sequence indices per row."""


def packing_supported() -> bool:
    """Whether this transformers builds per-sequence attention from packed position ids
    (masking_utils, transformers >= 4.53); without it rows hold one sequence each."""
    try:
        from transformers import masking_utils
    except ImportError:
        return False
    return hasattr(masking_utils, "find_packed_sequence_indices")


def row_width(attn_implementation: str, budget: int, longest: int) -> int:
    """Packed row width: the whole budget for flash-attention kernels and context
    parallelism (attention within each sequence: the cost of a row is that of its
    sequences), the longest sequence for dense masks (sdpa, eager)."""
    per_sequence = attn_implementation.startswith("flash") or attn_implementation == ATTENTION
    return budget if per_sequence else longest


def group_rows(rows: Rows, lengths: Sequence[int], budget: int, max_seqs: int) -> list[Rows]:
    """Consecutive rows into micro-batches of rows x (widest row) <= budget token slots and
    at most max_seqs sequences."""
    batches: list[Rows] = []
    width = seqs = 0
    for row in rows:
        fill = sum(lengths[i] for i in row)
        wide = max(width, fill)
        if batches and (len(batches[-1]) + 1) * wide <= budget and seqs + len(row) <= max_seqs:
            batches[-1].append(row)
            width, seqs = wide, seqs + len(row)
        else:
            batches.append([row])
            width, seqs = fill, len(row)
    return batches


def plan(lengths: Sequence[int], budget: int, max_seqs: int, pack: bool, width: int) -> list[Rows]:
    """Micro-batches of rows of sequence indices: packed into rows of `width`, or one
    sequence per row in batch order."""
    longest = max(lengths, default=0)
    if longest > budget:
        raise ValueError(
            f"a sequence of {longest} tokens does not fit trainer.micro_batch_tokens={budget}"
        )
    rows = first_fit_rows(lengths, width, max_seqs) if pack else [[i] for i in range(len(lengths))]
    return group_rows(rows, lengths, budget, max_seqs)


def pack_rows(t: Tensors, rows: Rows, pad_id: int) -> Tensors:
    """The micro-batch of `rows`: its sequences' tensors (S, T) plus their packed rows.
    One scatter per tensor (no per-sequence Python loop: this runs every step)."""
    order = [i for row in rows for i in row]
    seqs = t.select(torch.tensor(order, dtype=torch.long)).trimmed()
    lengths = seqs.attention_mask.sum(dim=1)  # (S,) sequences are right-padded
    row_of = torch.tensor([r for r, row in enumerate(rows) for _ in row], dtype=torch.long)
    before = torch.cumsum(lengths, dim=0) - lengths  # (S,) tokens of earlier sequences
    firsts = torch.tensor([first for first, _ in _starts(rows)], dtype=torch.long)
    offset = before - before[firsts][row_of]  # (S,) where each sequence starts in its row
    fills = torch.zeros(len(rows), dtype=torch.long).index_add_(0, row_of, lengths)
    width = int(fills.max())
    steps = torch.arange(seqs.input_ids.shape[1])  # (T,)
    valid = steps < lengths.unsqueeze(1)  # (S, T)
    target = (row_of * width + offset).unsqueeze(1) + steps  # (S, T) into R*W
    ids = torch.full((len(rows) * width,), pad_id, dtype=torch.long)
    pos = torch.zeros(len(rows) * width, dtype=torch.long)
    comp = torch.zeros(len(rows) * width, dtype=torch.bool)
    flat = target[valid]
    ids[flat] = seqs.input_ids[valid].long()
    pos[flat] = steps.expand_as(valid)[valid]
    comp[flat] = seqs.completion_mask[valid].bool()
    index = torch.where(valid, target, 0)
    shape = (len(rows), width)
    seqs.packing = Packing(ids.view(shape), pos.view(shape), comp.view(shape), index)
    return seqs


def _starts(rows: Rows) -> list[tuple[int, list[int]]]:
    """(index of the row's first sequence in the micro-batch order, row) per row."""
    out, first = [], 0
    for row in rows:
        out.append((first, row))
        first += len(row)
    return out


def micro_batches(
    t: Tensors,
    budget: int,
    max_seqs: int,
    pack: bool,
    attn_implementation: str,
    pad_id: int,
    rows: bool = False,
) -> list[Tensors]:
    """The step's micro-batches (see the module docstring); with `rows` every one has its
    rows (`Packing`), one sequence a row when not packing (context parallelism runs rows)."""
    lengths = t.attention_mask.sum(dim=1).tolist()
    pack = pack and packing_supported()
    width = row_width(attn_implementation, budget, max(lengths, default=0))
    groups = plan(lengths, budget, max_seqs, pack, width)
    if not pack and not rows:
        return [t.select(torch.tensor([r[0] for r in g])).trimmed() for g in groups]
    return [pack_rows(t, g, pad_id) for g in groups]


def plan_micro_batches(
    t: Tensors,
    s: TrainerSettings,
    attn_implementation: str,
    pad_id: int,
    share: bool,
    max_row: int = 0,
    context: bool = False,
) -> tuple[list[Tensors], str]:
    """The step's token-budget micro-batches and their layout: with shared prompts
    (training/prompts.py) where `share` and some prompt repeats ("rows" when the first runs
    as rows, its widest row at most `max_row` tokens, else "shared"), else packed or padded
    (see the module docstring). Under context parallelism (`context`) shared prompts only
    when every micro-batch runs as rows, else rows packed (one sequence a row when
    trainer.packing is off): its forward runs only rows."""
    parts = None
    if share:
        parts = shared_micro_batches(t, s.micro_batch_tokens, s.micro_batch, pad_id, max_row)
    if context and parts is not None and not all(p.prompts and p.prompts.rows for p in parts):
        parts = None
    if parts is None:
        parts = micro_batches(
            t, s.micro_batch_tokens, s.micro_batch, s.packing, attn_implementation, pad_id, context
        )
    first = parts[0] if parts else None
    layout = (
        "rows"
        if first is not None and first.prompts is not None and first.prompts.rows
        else "shared"
        if first is not None and first.prompts is not None
        else "packed"
        if first is not None and first.packing is not None
        else "padded"
    )
    return parts, layout


def sequence_logprobs(
    model: Any,
    part: Tensors,
    chunk: int,
    temperature: float,
    with_entropy: bool = True,
    context: ContextGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs and entropies (S, T) of a micro-batch's sequences, in its
    per-sequence layout, whether it runs packed, padded or with shared prompts
    (training/prompts.py); `chunk` rows per forward. Under context parallelism (`context`)
    the micro-batch is packed or prompt rows and runs as one forward, its columns split over
    the group (training/context/forward.py)."""
    if part.prompts is not None:
        return shared_logprobs(model, part, chunk, temperature, with_entropy, context)
    p = part.packing
    if context is not None:
        if p is None:
            raise ValueError("context parallelism runs packed micro-batches only")
        logp, entropy = packed_logprobs(model, p, context, temperature, with_entropy)
        return _unpack(logp, p.index, part.completion_mask), _unpack(
            entropy, p.index, part.completion_mask
        )
    if p is None:
        return token_logprobs(
            model,
            part.input_ids,
            part.attention_mask,
            part.completion_mask,
            chunk,
            temperature,
            with_entropy,
        )
    logp, entropy = token_logprobs(
        model,
        p.input_ids,
        None,
        p.completion_mask,
        chunk,
        temperature,
        with_entropy,
        position_ids=p.position_ids,
    )  # (R, W)
    mask = part.completion_mask
    return _unpack(logp, p.index, mask), _unpack(entropy, p.index, mask)


def _unpack(packed: torch.Tensor, index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(R, W) values -> (S, T) per sequence, 0 outside `mask`."""
    return torch.where(mask, packed.reshape(-1)[index], 0.0)


def reference_logprobs(
    model: Any, part: Tensors, chunk: int, temperature: float, context: ContextGroup | None = None
) -> torch.Tensor:
    """The reference model's token log-probs (S, T) of a micro-batch: no grad, no entropy."""
    with torch.no_grad():
        ref, _ = sequence_logprobs(model, part, chunk, temperature, False, context)
    return ref
