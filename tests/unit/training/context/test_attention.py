"""The context-parallel attention refuses what it would get wrong, in one line."""

from __future__ import annotations

import pytest
import torch

from grpo_stream.training.context.attention import ContextAttention, context_attention


def _qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.zeros(1, 2, 4, 8)
    return q, q.clone(), q.clone()


def test_a_forward_without_its_context_is_an_error_not_local_attention() -> None:
    with pytest.raises(RuntimeError, match="without its context"):
        context_attention(None, *_qkv(), None)


@pytest.mark.parametrize("feature", ["sliding_window", "softcap", "s_aux"])
def test_attention_features_it_does_not_implement_are_refused(feature: str) -> None:
    context = ContextAttention(group=None, size=2, spans=())
    with pytest.raises(ValueError, match=f"uses {feature}.*trainer.context_parallel = 1"):
        context_attention(None, *_qkv(), None, context=context, **{feature: 4})
