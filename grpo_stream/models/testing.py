"""Tiny randomly initialised transformers models for tests and benchmarks: built in memory,
no download, float32 on the CPU. One builder per architecture, so every test and benchmark
that needs "a small Qwen2" or "a small GPT-2" of some shape gets the same construction.

(The model that ships in grpo_stream/assets is another thing: a trained checkpoint, built by
`grpo_stream.builds.tiny`.)
"""

from __future__ import annotations

from typing import Any


def qwen2_config(
    vocab: int,
    hidden: int = 16,
    layers: int = 1,
    heads: int = 2,
    kv_heads: int = 1,
    intermediate: int | None = None,
    positions: int = 64,
    tie: bool = False,
    **extra: Any,
) -> Any:
    """A Qwen2Config of this shape (`intermediate` defaults to 2 x hidden); `extra` passes
    further config fields (head_dim, num_labels, pad_token_id, ...)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=positions,
        tie_word_embeddings=tie,
        **extra,
    )


def tiny_qwen2(vocab: int = 16, seed: int = 0, train: bool = False, **shape: Any) -> Any:
    """A Qwen2 causal LM (`shape`: the arguments of `qwen2_config`), float32, seeded; in eval
    mode (deterministic forward, no dropout) unless `train`."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model: Any = Qwen2ForCausalLM(qwen2_config(vocab, **shape))
    return model.float().train(train)


def tiny_gpt2(
    vocab: int = 16,
    seed: int = 0,
    hidden: int = 16,
    layers: int = 1,
    heads: int = 2,
    positions: int = 64,
    train: bool = False,
) -> Any:
    """A GPT-2 causal LM (absolute position embeddings), float32, seeded; eval unless `train`."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        n_positions=positions,
        bos_token_id=0,
        eos_token_id=0,
    )
    model: Any = GPT2LMHeadModel(config)
    return model.float().train(train)
