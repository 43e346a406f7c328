"""Fixtures of the algo tests: a tiny Qwen2 policy built in memory (no download)."""

from __future__ import annotations

from typing import Any

import pytest
import torch


def make_tiny_model(seed: int = 0, vocab: int = 16) -> Any:
    """A Qwen2 causal LM with a few thousand parameters, float32, in eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config).float()
    model.eval()  # no dropout: forward is deterministic
    return model


def make_tiny_gpt2(seed: int = 0, vocab: int = 16) -> Any:
    """A GPT-2 causal LM (absolute position embeddings) with a few thousand parameters."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab,
        n_embd=16,
        n_layer=1,
        n_head=2,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config).float()
    model.eval()
    return model


@pytest.fixture
def tiny_model() -> Any:
    torch.set_num_threads(1)
    return make_tiny_model()


@pytest.fixture
def tiny_gpt2() -> Any:
    torch.set_num_threads(1)
    return make_tiny_gpt2()
