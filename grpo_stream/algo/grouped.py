"""Log-probs of completions that share a prompt, each prompt and its completions in one row.

A group (a prompt and its completions) lies in one row: [p | c_1 | c_2 | ...], and short
groups share a row (first-fit within the widest group's width). A 4D attention mask lets
each completion token see its own prompt and its own earlier tokens, never another
completion's or another group's, and the position ids of every completion restart after
its prompt (completion k's token j at position P + j, as in its own sequence). So every
completion token's log-prob is the same function of the weights as in its sequence's own
forward, each prompt runs once, and a micro-batch is one forward and one backward over
dense rows: no per-length forwards and no KV cache, as `logprobs.shared_prompt_logprobs`
needs.

The price is dense attention over a row (W x W per row and layer, the masked entries
computed too), so rows suit short groups: `rows_width` keeps that under `MAX_ATTENTION_SHARE`
of the row's other compute. Measured on the tiny model at bench.vs_trl's base shape (CPU,
docs/results.md): faster than the per-length forwards on one thread, more so on two
(larger matrix products scale across threads).

Invariants:
- `[s, j]` is log p(completion_ids[s, j] | prompt, completion_ids[s, :j]) of the tempered
  distribution, 0 on padding; it equals the sequence's own forward up to float rounding
  (tests/unit/algo/test_grouped.py checks values and gradients against it);
- a prompt token sees only its own prompt's earlier tokens; pads see only themselves (no
  row of the softmax is empty);
- `rows_work(model)` must hold before a model is given rows: it checks on a tiny input that
  the model applies a 4D mask and position ids as given (a model that rebuilt its own
  causal mask would let completions see each other).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpo_stream.algo.bins import first_fit_rows
from grpo_stream.algo.logprobs import SharedLayout, next_token_logprobs, token_logprobs

MAX_ATTENTION_SHARE = 0.25
"""The most the dense attention of a row may cost against the rest of its forward
(`attention_share`); wider groups run per-length forwards on the prompt's KV cache."""


@dataclass(frozen=True)
class Rows:
    """A micro-batch's groups laid out one per row."""

    input_ids: torch.Tensor  # (R, W) long
    position_ids: torch.Tensor  # (R, W) long
    allowed: torch.Tensor  # (R, 1, W, W) bool: query q may attend to key k
    row: torch.Tensor  # (S,) long: each completion's row
    column: torch.Tensor  # (S, C) long: the column whose logits predict token (s, j)


def _widths(
    prompt_mask: torch.Tensor, prompt_of: torch.Tensor, completion_attn: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt lengths (U,), completion lengths (S,), row lengths (U,))."""
    prompt_len = prompt_mask.sum(dim=1)
    comp_len = completion_attn.sum(dim=1)
    rows = prompt_len.clone().index_add_(0, prompt_of, comp_len)
    return prompt_len, comp_len, rows


def row_width(
    prompt_mask: torch.Tensor, prompt_of: torch.Tensor, completion_attn: torch.Tensor
) -> int:
    """The widest row: a prompt plus all its completions' tokens."""
    return int(_widths(prompt_mask, prompt_of, completion_attn)[2].max())


def attention_share(width: int, config: Any) -> float:
    """Dense attention's cost over a row of `width` against its projections and MLP, per
    token and layer: 4*W*h (scores and weighted values) over 2*(4*h*h + 3*h*i) (q, k, v, o
    and a gated MLP), i.e. 2W / (4h + 3i). Sizes from the model config (GPT-2's names too)."""
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or 1)
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
    return 2 * width / (4 * hidden + 3 * int(inner or 4 * hidden))


def rows_width(config: Any) -> int:
    """The widest row whose `attention_share` is at most MAX_ATTENTION_SHARE: groups up to
    this many tokens run as rows."""
    width = int(MAX_ATTENTION_SHARE / attention_share(1, config))
    return width + 1 if attention_share(width + 1, config) <= MAX_ATTENTION_SHARE else width


def build_rows(layout: SharedLayout) -> Rows:
    """The rows of a shared-prompt `layout`. A group
    (a prompt and its completions) never spans two rows; groups share a row first-fit
    (algo/bins.py) within the widest group's width, so short groups do not pad to the
    longest. Pads hold token 0: no other token sees them and their logits are never read."""
    prompt_ids, prompt_mask, prompt_of = layout.prompt_ids, layout.prompt_mask, layout.prompt_of
    completion_ids, completion_attn = layout.completion_ids, layout.completion_attn
    device = prompt_ids.device
    prompt_len, comp_len, unit_len = _widths(prompt_mask, prompt_of, completion_attn)
    seqs, width = completion_ids.shape[0], int(unit_len.max())
    bins = first_fit_rows(unit_len.tolist(), width, len(unit_len))
    row_of = torch.empty(len(unit_len), dtype=torch.long)
    offset = torch.empty(len(unit_len), dtype=torch.long)
    for b, members in enumerate(bins):
        at = 0
        for u in members:
            row_of[u], offset[u] = b, at
            at += int(unit_len[u])
    row_of, offset = row_of.to(device), offset.to(device)
    # each completion's first column: its group's offset and prompt, then its earlier tokens
    before = torch.cumsum(comp_len, dim=0) - comp_len  # (S,) tokens of earlier completions
    first_of = torch.searchsorted(prompt_of, torch.arange(len(unit_len), device=device))  # (U,)
    within = before - before[first_of.clamp(max=seqs - 1)][prompt_of]  # (S,)
    start = offset[prompt_of] + prompt_len[prompt_of] + within
    steps_c = torch.arange(completion_ids.shape[1], device=device)
    valid = steps_c < comp_len.unsqueeze(1)  # (S, C)
    shape = (len(bins), width)
    ids = torch.zeros(shape, dtype=torch.long, device=device)
    pos = torch.zeros(shape, dtype=torch.long, device=device)
    owner = torch.full(shape, -1, dtype=torch.long, device=device)  # the group; -1: pad
    seg = torch.full(shape, -2, dtype=torch.long, device=device)  # -1 prompt, s completion
    steps_p = torch.arange(prompt_ids.shape[1], device=device)
    in_prompt = steps_p < prompt_len.unsqueeze(1)  # (U, P)
    pr = row_of.unsqueeze(1).expand_as(in_prompt)[in_prompt]
    pc = (offset.unsqueeze(1) + steps_p)[in_prompt]
    ids[pr, pc] = prompt_ids[in_prompt].long()
    pos[pr, pc] = steps_p.expand_as(in_prompt)[in_prompt]
    owner[pr, pc] = (
        torch.arange(len(unit_len), device=device).unsqueeze(1).expand_as(in_prompt)[in_prompt]
    )
    seg[pr, pc] = -1
    cols = start.unsqueeze(1) + steps_c  # (S, C)
    r, c = row_of[prompt_of].unsqueeze(1).expand_as(cols)[valid], cols[valid]
    ids[r, c] = completion_ids[valid].long()
    pos[r, c] = (prompt_len[prompt_of].unsqueeze(1) + steps_c).expand_as(cols)[valid]
    owner[r, c] = prompt_of.unsqueeze(1).expand_as(cols)[valid]
    seg[r, c] = torch.arange(seqs, device=device).unsqueeze(1).expand_as(cols)[valid]
    q = torch.arange(width, device=device)
    causal = q.unsqueeze(1) >= q.unsqueeze(0)  # (W, W)
    own_q, own_k = owner.unsqueeze(2), owner.unsqueeze(1)  # (R, W, 1), (R, 1, W)
    seg_q, seg_k = seg.unsqueeze(2), seg.unsqueeze(1)
    sees = (own_q == own_k) & (own_q >= 0) & ((seg_k == -1) | (seg_q == seg_k))
    allowed = (causal & sees) | torch.eye(width, dtype=torch.bool, device=device)
    # token (s, 0) is predicted at its prompt's last column, token (s, j) at column start+j-1
    # (padding too: any column at or right of the first one the LM head runs on)
    last = (offset + prompt_len - 1)[prompt_of].unsqueeze(1)
    column = torch.where(valid & (steps_c > 0), cols - 1, last)
    return Rows(ids, pos, allowed.unsqueeze(1), row_of[prompt_of], column)


def _mask(allowed: torch.Tensor, model: Any) -> torch.Tensor:
    """The 4D mask as the model's attention takes it: boolean for sdpa, additive for eager
    (which adds the mask to its scores)."""
    if str(getattr(model.config, "_attn_implementation", "sdpa")) == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(torch.float32).min
    )


def grouped_logprobs(
    model: Any,
    layout: SharedLayout,
    chunk: int,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies (S, C) float32, as `logprobs.shared_prompt_logprobs` takes
    and returns them. `chunk`: sequences per forward as the trainer sizes them (the memory of
    their logits); a forward takes as many rows as fit the same token slots (at least one)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    rows = build_rows(layout)
    prompt_ids, completion_ids = layout.prompt_ids, layout.completion_ids
    sequence = prompt_ids.shape[1] + completion_ids.shape[1]  # a sequence's slots, at most
    chunk = max(1, chunk * sequence // rows.input_ids.shape[1])  # rows per forward
    # the LM head runs from the first column that predicts a completion token on (the model
    # takes logits_to_keep: rows run only where shared prompts do, which checks it)
    first = int(rows.column.min())
    keep = torch.arange(first, rows.input_ids.shape[1], device=prompt_ids.device)
    logps: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    order: list[torch.Tensor] = []
    for lo in range(0, rows.input_ids.shape[0], chunk):
        sl = slice(lo, lo + chunk)
        seqs = torch.nonzero((rows.row >= lo) & (rows.row < lo + chunk)).squeeze(1)
        logits = model(
            input_ids=rows.input_ids[sl],
            attention_mask=_mask(rows.allowed[sl], model),
            position_ids=rows.position_ids[sl],
            use_cache=False,
            logits_to_keep=keep,
        ).logits  # (r, W - first, V)
        at = logits[(rows.row[seqs] - lo).unsqueeze(1), rows.column[seqs] - first]  # (s, C, V)
        logp, ent = next_token_logprobs(at, completion_ids[seqs].long(), temperature, with_entropy)
        logps.append(logp)
        entropies.append(torch.zeros_like(logp) if ent is None else ent)
        order.append(seqs)
    inverse = torch.argsort(torch.cat(order))  # chunks hold their rows' sequences: reorder
    valid = layout.completion_attn.bool()
    logp_all = torch.cat(logps).index_select(0, inverse)
    ent_all = torch.cat(entropies).index_select(0, inverse)
    return torch.where(valid, logp_all, 0.0), torch.where(valid, ent_all, 0.0)


def rows_work(model: Any) -> bool:
    """Whether `model` gives rows the log-probs of each sequence's own forward: two
    completions of one prompt, tiny, no grad, against `token_logprobs` of each alone."""
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    ids = [(7 * k + 3) % (vocab - 1) + 1 for k in range(9)]  # fixed, pad-free tokens
    prompt = torch.tensor([ids[:3]], device=device)
    completions = torch.tensor([ids[3:6], ids[6:9]], device=device)
    ones = torch.ones_like(completions)
    training = model.training
    model.eval()  # dropout would make the two forwards differ
    try:
        return _same(model, prompt, completions, ones)
    finally:
        model.train(training)


def _same(model: Any, prompt: torch.Tensor, completions: torch.Tensor, ones: torch.Tensor) -> bool:
    device = prompt.device
    with torch.no_grad():
        of = torch.zeros(2, dtype=torch.long, device=device)
        layout = SharedLayout(prompt, torch.ones_like(prompt), of, completions, ones)
        got, _ = grouped_logprobs(model, layout, chunk=1, with_entropy=False)
        full = torch.cat([prompt.expand(2, -1), completions], dim=1)
        mask = torch.zeros_like(full, dtype=torch.bool)
        mask[:, 3:] = True
        want, _ = token_logprobs(model, full, torch.ones_like(full), mask, 2, with_entropy=False)
    exact = next(model.parameters()).dtype == torch.float32
    tol = 1e-3 if exact else 2e-2  # bf16 / fp16: two kernels' rounding differs more
    return bool(torch.allclose(got.float(), want[:, 3:].float(), atol=tol, rtol=tol))
