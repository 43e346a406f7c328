"""Fixtures of the algo tests: a tiny Qwen2 policy built in memory (no download)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from grpo_stream.models import testing


def make_tiny_model(seed: int = 0, vocab: int = 16) -> Any:
    """A Qwen2 causal LM with a few thousand parameters, float32, in eval mode."""
    return testing.tiny_qwen2(vocab, seed, hidden=16, intermediate=32)


def make_tiny_gpt2(seed: int = 0, vocab: int = 16) -> Any:
    """A GPT-2 causal LM (absolute position embeddings) with a few thousand parameters."""
    return testing.tiny_gpt2(vocab, seed)


@pytest.fixture
def tiny_model() -> Any:
    torch.set_num_threads(1)
    return make_tiny_model()


@pytest.fixture
def tiny_gpt2() -> Any:
    torch.set_num_threads(1)
    return make_tiny_gpt2()
