"""Shared-prompt log-probs (each prompt once, completions on its KV cache) against the
full-sequence `token_logprobs`: values, entropies and gradients, on tiny Qwen2 and GPT-2."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_stream.algo.logprobs import (
    SharedLayout,
    completion_buckets,
    shared_prompt_logprobs,
    shared_prompts_supported,
    token_logprobs,
)

sys.path.insert(0, str(Path(__file__).parent))
from shared_layouts import PROMPT_OF, PROMPTS, assert_same_grads, grads, shared_layout

COMPLETIONS = [[5, 6, 2], [7], [8, 9, 4, 6], [11, 12], [13, 3, 2], [14, 15, 1, 2, 3]]


def full_layout() -> dict[str, torch.Tensor]:
    """The sequences one per row, right-padded, as the trainer's padded path runs them."""
    seqs = [PROMPTS[u] + c for u, c in zip(PROMPT_OF, COMPLETIONS, strict=True)]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    completion = torch.zeros(len(seqs), width, dtype=torch.bool)
    for s, seq in enumerate(seqs):
        ids[s, : len(seq)] = torch.tensor(seq)
        attention[s, : len(seq)] = 1
        completion[s, len(PROMPTS[PROMPT_OF[s]]) : len(seq)] = True
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}


def layout() -> SharedLayout:
    return shared_layout(PROMPTS, COMPLETIONS, PROMPT_OF)


def to_full(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(S, C) completion values into the (S, T) full layout."""
    out = torch.zeros_like(like)
    for s, c in enumerate(COMPLETIONS):
        start = len(PROMPTS[PROMPT_OF[s]])
        out[s, start : start + len(c)] = values[s, : len(c)]
    return out


OVERHEADS = [0, 3, 10**6]
"""Bucket overheads: a forward per distinct length, a few, one forward for all."""


@pytest.mark.parametrize("chunk", [1, 4, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("overhead", OVERHEADS)
def test_shared_prompt_logprobs_equal_the_full_forward(
    tiny_model: Any, chunk: int, temperature: float, overhead: int
) -> None:
    full = full_layout()
    ref, ref_ent = token_logprobs(tiny_model, **full, chunk=64, temperature=temperature)
    logp, ent = shared_prompt_logprobs(
        tiny_model, layout(), chunk=chunk, temperature=temperature,
        bucket_overhead=overhead,
    )  # fmt: skip
    torch.testing.assert_close(to_full(logp, ref), ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(to_full(ent, ref_ent), ref_ent, rtol=0, atol=1e-5)


@pytest.mark.parametrize("model", ["tiny_model", "tiny_gpt2"])
@pytest.mark.parametrize("overhead", OVERHEADS)
def test_shared_prompt_gradients_equal_the_full_forward(
    model: str, overhead: int, request: pytest.FixtureRequest
) -> None:
    lm = request.getfixturevalue(model)
    weights = torch.linspace(-1.0, 1.0, 6).unsqueeze(1)  # every sequence its own weight
    ref, _ = token_logprobs(lm, **full_layout(), chunk=64, temperature=0.7)
    (ref * weights).sum().backward()
    expected = grads(lm)
    logp, _ = shared_prompt_logprobs(
        lm, layout(), chunk=4, temperature=0.7, bucket_overhead=overhead
    )
    (logp * weights).sum().backward()
    assert_same_grads(grads(lm), expected, rel=1e-6)


def test_padding_positions_hold_zero(tiny_model: Any) -> None:
    data = layout()
    logp, ent = shared_prompt_logprobs(tiny_model, data, chunk=64)
    pads = data.completion_attn == 0
    assert bool(pads.any())
    assert bool((logp[pads] == 0).all()) and bool((ent[pads] == 0).all())


def test_without_entropy_the_entropies_are_zeros(tiny_model: Any) -> None:
    _, ent = shared_prompt_logprobs(tiny_model, layout(), chunk=64, with_entropy=False)
    assert bool((ent == 0).all())


def test_transformers_models_support_shared_prompts(tiny_model: Any, tiny_gpt2: Any) -> None:
    assert shared_prompts_supported(tiny_model) and shared_prompts_supported(tiny_gpt2)


def test_a_model_without_cache_argument_is_not_supported() -> None:
    class Old(torch.nn.Module):
        def forward(self, input_ids: Any, past_key_values: Any = None) -> Any: ...

    assert not shared_prompts_supported(Old())


def slots(buckets: list[list[int]], lengths: list[int], overhead: int) -> int:
    return sum(len(b) * max(lengths[s] for s in b) + overhead for b in buckets)


@pytest.mark.parametrize("overhead", [0, 2, 5, 40])
def test_completion_buckets_are_the_cheapest_split(overhead: int) -> None:
    lengths = [3, 1, 4, 2, 3, 6, 6, 9, 0, 2, 7]
    buckets = completion_buckets(lengths, overhead)
    run = sorted(s for b in buckets for s in b)
    assert run == [s for s, n in enumerate(lengths) if n > 1]  # every row of > 1 token, once
    for b in buckets:
        assert [lengths[s] for s in b] == sorted(lengths[s] for s in b)
    # brute force: every way to cut the sorted rows of length > 1 into consecutive runs
    ordered = sorted((n, s) for s, n in enumerate(lengths) if n > 1)
    best = None
    for cuts in itertools.product([False, True], repeat=len(ordered) - 1):
        split, current = [], [ordered[0][1]]
        for cut, (_, s) in zip(cuts, ordered[1:], strict=True):
            if cut:
                split.append(current)
                current = []
            current.append(s)
        split.append(current)
        cost = slots(split, lengths, overhead)
        best = cost if best is None else min(best, cost)
    assert slots(buckets, lengths, overhead) == best


def test_completion_buckets_of_rows_that_need_no_forward() -> None:
    assert completion_buckets([1, 0, 1], 0) == []
    assert completion_buckets([], 0) == []


def test_the_split_forwards_run_one_per_bucket(tiny_model: Any) -> None:
    calls: list[int] = []
    forward = tiny_model.forward

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(int(kwargs["input_ids"].shape[1]))
        return forward(*args, **kwargs)

    tiny_model.forward = counting
    try:
        shared_prompt_logprobs(tiny_model, layout(), chunk=64, bucket_overhead=0)
    finally:
        del tiny_model.forward
    lengths = [len(c) for c in COMPLETIONS]
    widths = sorted({n for n in lengths if n > 1})
    assert calls[0] == max(map(len, PROMPTS))  # the prompts' forward
    assert sorted(calls[1:]) == widths  # then one forward per distinct length > 1
