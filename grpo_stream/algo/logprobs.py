"""Per-token log-probs and entropies of a causal LM, chunked over sequences.

Invariants:
- `logp[b, t] = log p(x_t | x_<t)` of the tempered distribution softmax(logits / temperature);
  position 0 (no context) and every position outside `completion_mask` hold exactly 0.
- No full (B, T, V) float32 log-softmax is ever built: the model runs on `chunk` sequences at
  a time and each chunk's log-prob is gather(logits) - logsumexp(logits), so float32 temporaries
  are (chunk, T, V) at most. (Under autograd each chunk's logits are still saved for backward;
  the trainer bounds that with its micro-batch size.)
- Entropies are computed under `torch.no_grad` (they are logged, not trained on).
- Position ids come from the attention mask (cumsum - 1), so left and right padding give the
  same log-probs as the unpadded sequence. Packed rows (several sequences in one row) pass
  their own `position_ids`, restarting at 0 for each sequence, and no attention mask:
  transformers then confines attention to each sequence (a block-diagonal mask for sdpa and
  eager, varlen kernels for flash-attention), see grpo_stream.training.packing.
- The forward never builds a KV cache (`use_cache=False`): a cache would also make
  transformers ignore the packed position ids. The one exception is `shared_prompt_logprobs`:
  sequences that share a prompt (a GRPO group) run it once, and its KV cache, with grad, is
  what each completion attends to; every completion token's log-prob is the same function of
  the weights as in the full-sequence forward (the prompt's gradient is the sum of what each
  completion sends back through its copy), and the LM head runs only on the positions whose
  next token is a completion token.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

BUCKET_OVERHEAD = 32
"""Token slots one more completion forward is worth (`completion_buckets`): its fixed cost
(a pass through every layer, forward and backward) in units of one token's compute. Measured
on the tiny model on one CPU thread (bench.vs_trl_step); larger models make a token dearer,
so fewer slots' overhead."""


@dataclass
class SharedLayout:
    """Sequences split at the prompts they share, each distinct prompt once (the layout
    `shared_prompt_logprobs` and `grouped.grouped_logprobs` take)."""

    prompt_ids: torch.Tensor  # (U, P) long: the distinct prompts, right-padded
    prompt_mask: torch.Tensor  # (U, P) long
    prompt_of: torch.Tensor  # (S,) long, non-decreasing: each sequence's prompt
    completion_ids: torch.Tensor  # (S, C) long: the tokens after the prompt, right-padded
    completion_attn: torch.Tensor  # (S, C) long


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) position of each token among the real tokens of its row; pads get 0."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def _chunk_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    )
    # out.logits[:, t] predicts token t + 1
    return next_token_logprobs(out.logits[:, :-1], input_ids[:, 1:], temperature, with_entropy)


def next_token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) (b, n) of the tempered softmax of `logits` (b, n, V), and its entropy."""
    # float32 from the logits on, whatever autocast the caller runs the model under
    with torch.autocast(logits.device.type, enabled=False):
        logits = logits.float()
        if temperature != 1.0:
            logits = logits / temperature
        lse = torch.logsumexp(logits, dim=-1)  # (b, n)
        logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse  # (b, n)
        entropy = None
        if with_entropy:
            with torch.no_grad():
                # H = -sum p log p = lse - sum p * logits
                probs = torch.exp(logits - lse.unsqueeze(-1))
                entropy = lse - (probs * logits).sum(dim=-1)  # (b, n)
    return logp, entropy


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    completion_mask: torch.Tensor,
    chunk: int,
    temperature: float = 1.0,
    with_entropy: bool = True,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (B, T) float32 (with grad when enabled) and entropies (B, T) float32.

    `input_ids`, `attention_mask` (B, T); `completion_mask` (B, T) bool marks the completion
    tokens; `chunk` rows go through the model at once. With `with_entropy=False` the
    entropies are zeros and cost nothing. Packed rows give `position_ids` (B, T) and
    `attention_mask=None`; otherwise the positions come from the attention mask.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if position_ids is None:
        if attention_mask is None:
            raise ValueError("token_logprobs needs an attention_mask or position_ids")
        position_ids = position_ids_from_mask(attention_mask)
    batch, length = input_ids.shape
    logps: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    for start in range(0, batch, chunk):
        sl = slice(start, start + chunk)
        rows_mask = None if attention_mask is None else attention_mask[sl]
        logp, ent = _chunk_logprobs(
            model, input_ids[sl], rows_mask, position_ids[sl], temperature, with_entropy
        )
        logps.append(logp)
        if ent is not None:
            entropies.append(ent)
    mask = completion_mask.bool()
    logp_all = torch.nn.functional.pad(torch.cat(logps), (1, 0))  # (B, T), 0 at t=0
    logp_all = torch.where(mask, logp_all, 0.0)
    if entropies:
        ent_all = torch.nn.functional.pad(torch.cat(entropies), (1, 0))
        ent_all = torch.where(mask, ent_all, 0.0)
    else:
        ent_all = torch.zeros(batch, length, device=logp_all.device)
    return logp_all, ent_all


def shared_prompts_supported(model: Any) -> bool:
    """Whether `model` (or the model under a peft wrapper) takes what
    `shared_prompt_logprobs` passes: a `cache` (transformers 5) and `logits_to_keep`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    return "cache" in params and "logits_to_keep" in params


def shared_prompt_logprobs(
    model: Any,
    layout: SharedLayout,
    chunk: int,
    temperature: float = 1.0,
    with_entropy: bool = True,
    bucket_overhead: int = BUCKET_OVERHEAD,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies (S, C) float32 of completions that share prompts (`layout`).

    `[s, j]` is log p(completion_ids[s, j] | prompt, completion_ids[s, :j]), 0 on padding.
    Each prompt runs once; prompts go through the model a few at a time, at most `chunk`
    sequences (or one prompt's) per forward. Their completions then run in forwards by length
    (`completion_buckets`, one more forward costing `bucket_overhead` token slots), so a long
    completion does not pad every short one to its length.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    prompt_ids, prompt_of = layout.prompt_ids, layout.prompt_of
    completion_ids, completion_attn = layout.completion_ids, layout.completion_attn
    counts = torch.bincount(prompt_of, minlength=prompt_ids.shape[0]).tolist()
    logps: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    lo = seq = 0
    while lo < len(counts):
        hi, rows = lo + 1, counts[lo]
        while hi < len(counts) and rows + counts[hi] <= chunk:
            rows += counts[hi]
            hi += 1
        span = slice(seq, seq + rows)
        logp, ent = _shared_chunk(
            model,
            prompt_ids[lo:hi],
            layout.prompt_mask[lo:hi],
            prompt_of[span] - lo,
            completion_ids[span],
            completion_attn[span],
            temperature,
            with_entropy,
            bucket_overhead,
        )
        logps.append(logp)
        entropies.append(ent if ent is not None else torch.zeros_like(logp))
        lo, seq = hi, seq + rows
    valid = completion_attn.bool()
    # without entropies every chunk appended zeros, so this is zeros too
    return torch.where(valid, torch.cat(logps), 0.0), torch.where(valid, torch.cat(entropies), 0.0)


def completion_buckets(lengths: list[int], overhead: int) -> list[list[int]]:
    """Rows of a shared-prompt chunk by completion length, into the forwards that run them.

    `lengths[s]`: row s's completion tokens. A forward over rows R runs |R| x max(R) token
    slots (its rows are right-padded), plus `overhead`: what one more forward costs, in token
    slots. Rows of length <= 1 need none (their one token is predicted from the prompt) and
    are left out. The split of the length-sorted rows into consecutive runs that minimises
    slots + overhead per forward (exact, over the distinct lengths); each run's rows sorted by
    length."""
    order = sorted((n, s) for s, n in enumerate(lengths) if n > 1)
    if not order:
        return []
    values = sorted({n for n, _ in order})
    counts = [sum(1 for n, _ in order if n == v) for v in values]
    # best[i]: the cheapest split of the rows of the i shortest distinct lengths
    best, cut = [0] + [0] * len(values), [0] * (len(values) + 1)
    for i in range(1, len(values) + 1):
        rows, options = 0, []
        for j in range(i, 0, -1):  # the last forward holds distinct lengths j-1 .. i-1
            rows += counts[j - 1]
            options.append((best[j - 1] + rows * values[i - 1] + overhead, j - 1))
        best[i], cut[i] = min(options)
    bounds, i = [], len(values)
    while i > 0:
        bounds.append((values[cut[i]], values[i - 1]))
        i = cut[i]
    return [[s for n, s in order if lo <= n <= hi] for lo, hi in reversed(bounds)]


def _bucket_cache(cache: Any, rows: torch.Tensor) -> Any | None:
    """A fresh KV cache holding `rows` of `cache`'s (with grad), or None when the cache is
    not plain per-layer dynamic (sliding windows, encoder-decoder): then it is not split."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    layers = getattr(cache, "layers", None)
    if type(cache) is not DynamicCache or not layers:
        return None
    if any(type(layer) is not DynamicLayer for layer in layers):
        return None
    data = [(lay.keys.index_select(0, rows), lay.values.index_select(0, rows)) for lay in layers]
    return DynamicCache(ddp_cache_data=data)


def _shared_chunk(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_of: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_attn: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    overhead: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    lengths = prompt_mask.sum(dim=1)  # (u,)
    keep = torch.unique(lengths - 1)  # (K,) sorted: the positions of the prompts' last tokens
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=position_ids_from_mask(prompt_mask),
        use_cache=True,
        logits_to_keep=keep,
    )
    rows = torch.arange(prompt_ids.shape[0], device=prompt_ids.device)
    last = out.logits[rows, torch.searchsorted(keep, lengths - 1)]  # (u, V): predicts c_0
    first = last[prompt_of].unsqueeze(1)  # (s, 1, V)
    if completion_ids.shape[1] == 1:
        return next_token_logprobs(first, completion_ids, temperature, with_entropy)
    tokens = completion_attn.sum(dim=1).tolist()  # each row's completion length
    buckets = completion_buckets(tokens, overhead)
    indices = [torch.tensor(b, device=completion_ids.device) for b in buckets]
    caches = [_bucket_cache(out.cache, prompt_of[idx]) for idx in indices]
    if any(c is None for c in caches):  # one forward over every row, the cache reordered
        for layer in out.cache.layers:  # in place (rows repeated, with grad)
            layer.reorder_cache(prompt_of)
        rest = _completion_logits(
            model,
            out.cache,
            prompt_mask[prompt_of],
            completion_ids,
            completion_attn,
            lengths[prompt_of],
        )
        logits = torch.cat([first, rest], dim=1)  # (s, C, V)
        return next_token_logprobs(logits, completion_ids, temperature, with_entropy)
    # one forward per length bucket, each on its own copy of its rows' prompt caches; rows
    # of one token are predicted from the prompt alone
    ran = [s for b in buckets for s in b]
    alone = sorted(set(range(completion_ids.shape[0])) - set(ran))
    parts = (
        [next_token_logprobs(first[alone], completion_ids[alone, :1], temperature, with_entropy)]
        if alone
        else []
    )
    for bucket, idx, cache in zip(buckets, indices, caches, strict=True):
        w = int(tokens[bucket[-1]])  # a bucket's rows are sorted by length: the last is longest
        ids, attn = completion_ids[idx, :w], completion_attn[idx, :w]
        of = prompt_of[idx]
        rest = _completion_logits(model, cache, prompt_mask[of], ids, attn, lengths[of])
        parts.append(
            next_token_logprobs(
                torch.cat([first[idx], rest], dim=1), ids, temperature, with_entropy
            )
        )
    inverse = torch.argsort(torch.tensor(alone + ran, device=completion_ids.device))

    def assemble(values: list[torch.Tensor]) -> torch.Tensor:
        width = completion_ids.shape[1]
        padded = [torch.nn.functional.pad(v, (0, width - v.shape[1])) for v in values]
        return torch.cat(padded).index_select(0, inverse)  # (s, C), rows in their order

    logp = assemble([lp for lp, _ in parts])
    entropies = [e for _, e in parts if e is not None]
    return logp, assemble(entropies) if with_entropy else None


def _completion_logits(
    model: Any,
    cache: Any,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_attn: torch.Tensor,
    prompt_lengths: torch.Tensor,
) -> torch.Tensor:
    """Logits (s, C-1, V) predicting completion tokens 1 .. C-1, each row attending to its
    prompt's KV in `cache` (one row per completion) and to its own earlier tokens."""
    width = completion_ids.shape[1]
    steps = torch.arange(width, device=completion_ids.device)
    logits: torch.Tensor = model(
        input_ids=completion_ids,
        attention_mask=torch.cat([prompt_mask, completion_attn], dim=1),
        position_ids=prompt_lengths.unsqueeze(1) + steps,
        cache=cache,
        use_cache=True,
        logits_to_keep=steps[: width - 1],
    ).logits
    return logits
