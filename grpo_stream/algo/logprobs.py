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
  transformers ignore the packed position ids.
"""

from __future__ import annotations

from typing import Any

import torch


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
    # float32 from the logits on, whatever autocast the caller runs the model under
    with torch.autocast(out.logits.device.type, enabled=False):
        logits = out.logits[:, :-1].float()  # (b, T-1, V): the prediction of the next token
        if temperature != 1.0:
            logits = logits / temperature
        targets = input_ids[:, 1:].unsqueeze(-1)  # (b, T-1, 1)
        lse = torch.logsumexp(logits, dim=-1)  # (b, T-1)
        logp = logits.gather(-1, targets).squeeze(-1) - lse  # (b, T-1)
        entropy = None
        if with_entropy:
            with torch.no_grad():
                # H = -sum p log p = lse - sum p * logits
                probs = torch.exp(logits - lse.unsqueeze(-1))
                entropy = lse - (probs * logits).sum(dim=-1)  # (b, T-1)
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
