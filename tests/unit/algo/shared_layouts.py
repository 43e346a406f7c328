"""What the tests of shared-prompt log-probs (`algo.logprobs`, KV cache) and grouped rows
(`algo.grouped`) both need: a layout built from token lists, and their gradient check."""

from __future__ import annotations

from typing import Any

import torch

from grpo_stream.algo.logprobs import SharedLayout

PROMPTS = [[1, 10, 11], [1, 12, 13, 14, 15], [3]]
"""Three distinct prompts (two share their first token)."""
PROMPT_OF = [0, 0, 0, 1, 1, 2]
"""The prompt of each of six completions: three, two and one."""


def shared_layout(
    prompts: list[list[int]], completions: list[list[int]], prompt_of: list[int]
) -> SharedLayout:
    """The distinct prompts and the completions, each right-padded with 0."""

    def padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        return ids, mask

    prompt_ids, prompt_mask = padded(prompts)
    completion_ids, completion_attn = padded(completions)
    return SharedLayout(
        prompt_ids, prompt_mask, torch.tensor(prompt_of), completion_ids, completion_attn
    )


def grads(model: Any) -> dict[str, torch.Tensor]:
    """The parameters' gradients, then zeroed for the next backward."""
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def assert_same_grads(
    got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], rel: float
) -> None:
    """Every parameter's gradient as expected, within `rel` of the largest (or of 1)."""
    assert got.keys() == expected.keys()
    scale = max(float(g.abs().max()) for g in expected.values())
    assert scale > 0
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, rtol=0, atol=rel * max(scale, 1.0))
