"""Fixtures: a tiny random Qwen2 model with a character-level tokenizer, saved to disk, and a
real weight server on loopback.

The model has head_dim 64 (what vLLM's CPU attention accepts) and about 0.1M parameters,
so a forward pass takes milliseconds on one CPU thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.transport.weights import WeightServer

# vLLM's CPU backend sizes its KV cache as gpu_memory_utilization x the NUMA node's memory
# minus the worker's own RSS (~0.6 GiB): the tests' 0.05 of a 24 GiB node left room, of a
# 12 GiB node it is negative and every engine fails to start (seen 2026-12-04). An explicit
# 1 GiB cache (vLLM's CPU setting; `up` runs started here inherit it) makes the tests
# independent of the node's size; vLLM on a GPU ignores it.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

CHARS = "0123456789+-*=?. abcdefghijklmnopqrstuvwxyz"
SPECIALS = ["<pad>", "<eos>"]


def build_char_tokenizer() -> Any:
    """A fast tokenizer with one token per character and <pad>/<eos> specials."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def build_tiny_model(tokenizer: Any, seed: int = 0) -> Any:
    """A randomly initialised 2-layer Qwen2 causal LM with tied embeddings (fp32, CPU)."""
    import torch

    from grpo_stream.models.testing import tiny_qwen2

    model = tiny_qwen2(
        len(tokenizer),
        seed,
        hidden=64,
        intermediate=128,
        layers=2,
        heads=1,
        kv_heads=1,
        head_dim=64,
        positions=128,
        tie=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    # Random init at std 0.02 gives nearly uniform next-token distributions; 0.06 makes
    # them peaked (mean log-prob about -2.5) while some rows still sample <eos> early.
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 0.06)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny model + tokenizer directory (what `name_or_path` can point at)."""
    import torch

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def tokenizer() -> Any:
    return build_char_tokenizer()


@pytest.fixture
def hf_engine(tokenizer: Any) -> Iterator[Any]:
    """An HFEngine on the CPU over a fresh tiny model (tests may modify it)."""
    import torch

    from grpo_stream.engines.hf import HFEngine

    torch.set_num_threads(1)
    engine = HFEngine(build_tiny_model(tokenizer), tokenizer, device="cpu")
    yield engine
    engine.close()


@pytest.fixture
def weight_server() -> Iterator[WeightServer]:
    """A real trainer weight server on loopback (plaintext)."""
    ctx: zmq.Context[Any] = zmq.Context()
    server = WeightServer(
        ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", TransportSettings(), SecuritySettings()
    )
    yield server
    server.close()
    ctx.destroy(linger=0)
