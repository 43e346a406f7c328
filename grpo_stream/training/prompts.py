"""Shared-prompt micro-batches: each distinct prompt runs once, its completions after it.

The G completions of a GRPO group share one prompt, and a full-sequence forward (padded or
packed, and TRL's) runs that prompt G times. Here a micro-batch holds whole prompt groups:
its distinct prompts go through the model once, and each completion attends to its prompt's
KV cache (rows repeated, with grad), see `grpo_stream.algo.logprobs.shared_prompt_logprobs`.
The LM head runs only where a completion token is predicted.

Invariants:
- a sequence's prompt is its tokens before its first completion-mask token (a prompt has >= 1
  token); sequences share a prompt only when those tokens are identical (compared, never
  inferred from group ids), so any batch is handled, episodes and lone sequences included;
- every sequence of the step is in exactly one micro-batch, each micro-batch keeps its
  per-sequence tensors ((S, T), the layout the loss reads), and its log-probs and their
  gradients equal the full forward's (tests/unit/training/test_prompts.py);
- a micro-batch's forward holds at most `trainer.micro_batch_tokens` token slots (distinct
  prompts x longest prompt + sequences x longest completion) and `trainer.micro_batch`
  sequences; a group larger than that is split, each part running the prompt again.

A micro-batch runs in one of two ways: as rows (`algo.grouped`: each prompt and all its
completions in one row with a 4D mask, one forward) when its widest row suits that
(at most `rows_width` tokens, given as `max_row`), else on the prompts' KV cache (`algo.logprobs.
shared_prompt_logprobs`: the prompts' forward, then one forward per completion length).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from grpo_stream.algo.grouped import grouped_logprobs, row_width
from grpo_stream.algo.logprobs import shared_prompt_logprobs
from grpo_stream.training.batch import SharedPrompts, Tensors
from grpo_stream.training.context.forward import rows_logprobs
from grpo_stream.training.context.groups import ContextGroup

Piece = list[int]
"""Sequence indices that share one prompt (a group, or part of one)."""


def prompt_splits(t: Tensors) -> list[int]:
    """Per sequence: the position of its first completion token (its length when it has
    none), i.e. its prompt's length."""
    mask = t.completion_mask.bool()
    lengths = t.attention_mask.sum(dim=1)
    first = torch.where(mask.any(dim=1), mask.long().argmax(dim=1), lengths)
    return [int(v) for v in first.tolist()]


def prompt_groups(t: Tensors, splits: Sequence[int]) -> list[Piece]:
    """Sequences with identical prompt tokens, in order of first appearance."""
    rows = t.input_ids.tolist()
    groups: dict[tuple[int, ...], Piece] = {}
    for i, split in enumerate(splits):
        groups.setdefault(tuple(rows[i][:split]), []).append(i)
    return list(groups.values())


def plan(
    groups: Sequence[Piece],
    splits: Sequence[int],
    lengths: Sequence[int],
    budget: int,
    max_seqs: int,
) -> list[list[Piece]]:
    """Consecutive pieces into micro-batches of at most `budget` token slots and `max_seqs`
    sequences; groups too large for one are split first."""
    batches: list[list[Piece]] = []
    prompt = completion = seqs = 0  # the open micro-batch's widths and sequences
    for piece in _pieces(groups, splits, lengths, budget, max_seqs):
        p = splits[piece[0]]
        c = max(lengths[i] - splits[i] for i in piece)
        wide_p, wide_c, n = max(prompt, p), max(completion, c), seqs + len(piece)
        count = len(batches[-1]) + 1 if batches else 0
        if batches and count * wide_p + n * wide_c <= budget and n <= max_seqs:
            batches[-1].append(piece)
            prompt, completion, seqs = wide_p, wide_c, n
        else:
            batches.append([piece])
            prompt, completion, seqs = p, c, len(piece)
    return batches


def _pieces(
    groups: Sequence[Piece],
    splits: Sequence[int],
    lengths: Sequence[int],
    budget: int,
    max_seqs: int,
) -> list[Piece]:
    """Each group, cut into pieces that fit one micro-batch on their own."""
    out: list[Piece] = []
    for group in groups:
        p = splits[group[0]]
        piece: Piece = []
        for i in group:
            wide = max([lengths[j] - splits[j] for j in piece] + [lengths[i] - splits[i]])
            if p + wide > budget:
                raise ValueError(
                    f"a sequence of {lengths[i]} tokens does not fit "
                    f"trainer.micro_batch_tokens={budget}"
                )
            if piece and (len(piece) >= max_seqs or p + (len(piece) + 1) * wide > budget):
                out.append(piece)
                piece = []
            piece.append(i)
        out.append(piece)
    return out


def shared_batch(
    t: Tensors,
    pieces: Sequence[Piece],
    splits: Sequence[int],
    pad_id: int,
    max_row: int = 0,
) -> Tensors:
    """The micro-batch of `pieces`: their sequences' tensors (S, T), split at the prompts;
    as rows when its widest row (a prompt and its completions) is at most `max_row` tokens."""
    order = [i for piece in pieces for i in piece]
    seqs = t.select(torch.tensor(order, dtype=torch.long)).trimmed()
    split = torch.tensor([splits[i] for i in order], dtype=torch.long)  # (S,)
    lengths = seqs.attention_mask.sum(dim=1)  # (S,) sequences are right-padded
    firsts = torch.tensor([sum(len(q) for q in pieces[:k]) for k in range(len(pieces))])
    prompt_len = split[firsts]  # (U,)
    width_p = int(prompt_len.max())
    steps_p = torch.arange(width_p)
    prompt_mask = (steps_p < prompt_len.unsqueeze(1)).long()  # (U, P)
    prompt_ids = seqs.input_ids[firsts, :width_p].masked_fill(prompt_mask == 0, pad_id)
    sizes = torch.tensor([len(piece) for piece in pieces])
    prompt_of = torch.repeat_interleave(torch.arange(len(pieces)), sizes)  # (S,)
    comp_len = lengths - split  # (S,)
    width_c = max(int(comp_len.max()), 1)
    steps_c = torch.arange(width_c)
    completion_attn = (steps_c < comp_len.unsqueeze(1)).long()  # (S, C)
    last = seqs.input_ids.shape[1] - 1
    source = (split.unsqueeze(1) + steps_c).clamp(max=last)  # (S, C) into T
    completion_ids = seqs.input_ids.gather(1, source).masked_fill(completion_attn == 0, pad_id)
    steps_t = torch.arange(seqs.input_ids.shape[1])
    index = (steps_t - split.unsqueeze(1)).clamp(0, width_c - 1)  # (S, T) into C
    rows = row_width(prompt_mask, prompt_of, completion_attn) <= max_row
    seqs.prompts = SharedPrompts(
        prompt_ids, prompt_mask, prompt_of, completion_ids, completion_attn, index, rows
    )
    return seqs


def shared_micro_batches(
    t: Tensors,
    budget: int,
    max_seqs: int,
    pad_id: int,
    max_row: int = 0,
) -> list[Tensors] | None:
    """The step's shared-prompt micro-batches; None when no prompt repeats (nothing to
    share: packing does as well). `max_row`: the widest row a micro-batch may have to run as
    rows (0: none does)."""
    splits = prompt_splits(t)
    groups = prompt_groups(t, splits)
    if len(groups) == t.size:
        return None
    lengths = [int(v) for v in t.attention_mask.sum(dim=1).tolist()]
    batches = plan(groups, splits, lengths, budget, max_seqs)
    return [shared_batch(t, pieces, splits, pad_id, max_row) for pieces in batches]


def shared_logprobs(
    model: Any,
    part: Tensors,
    chunk: int,
    temperature: float,
    with_entropy: bool,
    context: ContextGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs and entropies (S, T) of a shared-prompt micro-batch's sequences;
    under context parallelism (`context`) prompt rows only, split over the group."""
    sp = part.prompts
    if sp is None:
        raise ValueError("shared_logprobs needs a micro-batch built by shared_micro_batches")
    mask = part.completion_mask
    if context is not None:
        if not sp.rows:
            raise ValueError("context parallelism runs shared prompts as prompt rows only")
        logp, entropy = rows_logprobs(model, sp, context, temperature, with_entropy)
        return _to_sequences(logp, sp.index, mask), _to_sequences(entropy, sp.index, mask)
    run = grouped_logprobs if sp.rows else shared_prompt_logprobs  # same arguments
    logp, entropy = run(model, sp, chunk, temperature, with_entropy)  # (S, C)
    return _to_sequences(logp, sp.index, mask), _to_sequences(entropy, sp.index, mask)


def _to_sequences(values: torch.Tensor, index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(S, C) completion values -> (S, T) per sequence, 0 outside `mask`."""
    return torch.where(mask, values.gather(1, index), 0.0)
