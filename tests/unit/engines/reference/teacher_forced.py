"""The reference every engine test checks behaviour log-probs against: the tempered
log-softmax of each completion token from one unpadded transformers forward."""

from __future__ import annotations

from typing import Any

import torch


def teacher_forced_logprobs(
    model: Any, prompt_ids: list[int], token_ids: list[int], temperature: float = 1.0
) -> list[float]:
    """log_softmax(logits / T) of each of `token_ids` after `prompt_ids` and the tokens
    before it, from one forward pass of the whole unpadded sequence."""
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # (T, V)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    start = len(prompt_ids) - 1
    rows = logp[start : start + len(token_ids)]  # (N, V): row j predicts token_ids[j]
    return rows.gather(-1, torch.tensor(token_ids)[:, None])[:, 0].tolist()
