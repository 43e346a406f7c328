"""Chunked token log-probs against a naive full log-softmax, on a tiny real Qwen2 model."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from grpo_stream.algo.logprobs import token_logprobs


def batch(seed: int = 0, b: int = 5, t: int = 9, vocab: int = 16) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (b, t), generator=gen)
    attention = torch.ones(b, t, dtype=torch.long)
    attention[1, -2:] = 0  # right padding
    completion = torch.zeros(b, t, dtype=torch.bool)
    completion[:, 4:] = True  # prompt is the first 4 tokens
    completion &= attention.bool()
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}


def naive(model: Any, data: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    logits = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits
    logprobs = torch.log_softmax(logits / temperature, dim=-1)  # (B, T, V)
    picked = logprobs[:, :-1].gather(-1, data["input_ids"][:, 1:, None]).squeeze(-1)
    full = torch.nn.functional.pad(picked, (1, 0))
    return torch.where(data["completion_mask"], full, 0.0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_equal_naive_log_softmax(tiny_model: Any, temperature: float) -> None:
    data = batch()
    logp, _ = token_logprobs(tiny_model, **data, chunk=2, temperature=temperature)
    torch.testing.assert_close(logp, naive(tiny_model, data, temperature), rtol=1e-5, atol=1e-6)


def test_chunk_size_does_not_change_logprobs(tiny_model: Any) -> None:
    data = batch()
    one, _ = token_logprobs(tiny_model, **data, chunk=1)
    whole, _ = token_logprobs(tiny_model, **data, chunk=5)
    torch.testing.assert_close(one, whole, rtol=1e-5, atol=1e-6)


def test_non_completion_positions_are_exactly_zero(tiny_model: Any) -> None:
    data = batch()
    logp, entropy = token_logprobs(tiny_model, **data, chunk=3)
    outside = ~data["completion_mask"]
    assert torch.all(logp[outside] == 0) and torch.all(entropy[outside] == 0)
    assert torch.all(logp[data["completion_mask"]] < 0)


def test_position_zero_is_zero_even_when_marked_completion(tiny_model: Any) -> None:
    data = batch()
    data["completion_mask"][:, 0] = True
    logp, _ = token_logprobs(tiny_model, **data, chunk=3)
    assert torch.all(logp[:, 0] == 0)


def test_entropy_equals_naive_entropy(tiny_model: Any) -> None:
    data = batch()
    _, entropy = token_logprobs(tiny_model, **data, chunk=2, temperature=0.7)
    logits = tiny_model(input_ids=data["input_ids"]).logits[:, :-1] / 0.7
    probs = torch.softmax(logits, dim=-1)
    ref = -(probs * torch.log_softmax(logits, dim=-1)).sum(-1)
    ref = torch.where(data["completion_mask"], torch.nn.functional.pad(ref, (1, 0)), 0.0)
    torch.testing.assert_close(entropy, ref.detach(), rtol=1e-5, atol=1e-6)


def test_left_padding_gives_the_unpadded_logprobs(tiny_gpt2: Any) -> None:
    tiny_model = tiny_gpt2  # absolute positions: wrong position ids would show
    data = {k: v[:1] for k, v in batch().items()}  # row 0 has no padding
    plain, _ = token_logprobs(tiny_model, **data, chunk=1)
    pad = 3
    padded = {
        "input_ids": torch.nn.functional.pad(data["input_ids"], (pad, 0)),
        "attention_mask": torch.nn.functional.pad(data["attention_mask"], (pad, 0)),
        "completion_mask": torch.nn.functional.pad(data["completion_mask"], (pad, 0)),
    }
    shifted, _ = token_logprobs(tiny_model, **padded, chunk=1)
    torch.testing.assert_close(shifted[:, pad:], plain, rtol=1e-5, atol=1e-6)


def test_logprobs_carry_gradient_and_entropy_does_not(tiny_model: Any) -> None:
    logp, entropy = token_logprobs(tiny_model, **batch(), chunk=2)
    assert logp.requires_grad and not entropy.requires_grad
    logp.sum().backward()
    grads = [p.grad for p in tiny_model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_without_entropy_returns_zeros(tiny_model: Any) -> None:
    _, entropy = token_logprobs(tiny_model, **batch(), chunk=2, with_entropy=False)
    assert torch.all(entropy == 0)
