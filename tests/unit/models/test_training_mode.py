"""The trainable policy's forward: dropout off unless asked, activation checkpointing on
request (same gradients, fewer kept activations), a clear error where a model cannot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, CTRLConfig, CTRLLMHeadModel, Qwen2ForCausalLM

from grpo_stream.config import DEFAULT_MODEL
from grpo_stream.models.loading import enable_checkpointing, prepare_training, resolve_model


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _qwen(attention_dropout: float = 0.0) -> Any:
    config = AutoConfig.from_pretrained(resolve_model(DEFAULT_MODEL))
    config.attention_dropout = attention_dropout
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def _ids() -> torch.Tensor:
    return torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(1))


def test_policy_forward_has_no_dropout_unless_asked() -> None:
    model = _qwen(attention_dropout=0.5)
    prepare_training(model, dropout=False, checkpointing=False)
    assert model.training  # train mode stays: checkpointing only runs there
    ids = _ids()
    assert torch.equal(model(ids).logits, model(ids).logits)


def test_dropout_true_keeps_the_models_dropout() -> None:
    model = _qwen(attention_dropout=0.5)
    prepare_training(model, dropout=True, checkpointing=False)
    ids = _ids()
    assert not torch.equal(model(ids).logits, model(ids).logits)


def _grads(model: Any) -> dict[str, torch.Tensor]:
    ids = _ids()
    model(ids, labels=ids).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_checkpointing_recomputes_layers_with_the_same_gradients() -> None:
    plain, checkpointed = _qwen(), _qwen()
    prepare_training(plain, dropout=False, checkpointing=False)
    prepare_training(checkpointed, dropout=False, checkpointing=True)
    assert checkpointed.model.layers[0].gradient_checkpointing
    assert not plain.model.layers[0].gradient_checkpointing
    a, b = _grads(plain), _grads(checkpointed)
    for name, grad in a.items():
        torch.testing.assert_close(b[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_checkpointing_a_model_without_support_names_the_setting(tmp_path: Path) -> None:
    model = CTRLLMHeadModel(CTRLConfig(vocab_size=32, n_embd=16, n_layer=1, n_head=2, dff=32))
    with pytest.raises(ValueError, match=r"trainer\.gradient_checkpointing"):
        enable_checkpointing(model)
