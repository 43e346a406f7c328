"""Model shapes, FLOPs and device peaks for bench/gpu_scale.py (run with `python -P`, loaded
from beside it): what a training step's MFU and a decode step's bandwidth bound are made of.

Shapes: Qwen2.5-0.5B, 1.5B and 3B as their config.json files give them (hidden size,
intermediate size, layers, heads, key-value heads, vocabulary, tied embeddings), and a
`tiny` shape for the CPU rehearsal. Models are built from these with random weights: the
numbers depend on the shape, not on the values.

Model FLOPs of a training step (forward and backward, 3x the forward's):
    6 * N_mm * T  +  6 * n_layers * d_attn * sum over sequences of s * (s + 1)
- N_mm: the parameters that take part in a matrix multiply per token: every decoder
  layer's q, k, v, o and MLP projections, and the LM head (vocabulary x hidden, tied or
  not); the input embedding is a lookup, not a multiply, and norms and biases are left out.
- T: the tokens whose FLOPs the step needs. A GRPO group's G completions share one prompt:
  its tokens count once per group (prompt + all completion tokens); a layout that
  recomputes the prompt per sequence does more work than the model needs, and its MFU is
  lower for it.
- The attention term: a query at position t attends to t + 1 keys; QK^T and AV each cost
  2 * d_attn FLOPs per (query, key) pair, so a forward costs 2 * d_attn * s * (s + 1) per
  layer for a sequence of s tokens, and training three times that. A completion attends to
  its prompt and itself, so s is prompt + completion for each sequence (the prompt's own
  queries, once per group, are counted inside the first sequence of its group).
MFU = model FLOPs / step seconds / the device's dense bf16 peak (DATASHEET_BF16_TFLOPS by
the NVML name, else the fingerprint's derivation from SMs and clock).

Decode bound (hf generator): every decode step reads the weights once (2 bytes a parameter
in bf16, the tied embedding once as the LM head) and each sequence's KV cache so far
(2 * n_layers * kv_heads * head_dim * context * 2 bytes); the bound on tokens/s at batch B
is B / (bytes / HBM bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's shape (Qwen2 layout: GQA, SwiGLU MLP, q/k/v biases)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def matmul_params(self) -> int:
        """N_mm: weights in a matrix multiply per token (decoder projections + LM head)."""
        h, kv = self.hidden, self.kv_dim
        per_layer = 2 * h * h + 2 * h * kv + 3 * h * self.intermediate
        return self.layers * per_layer + self.vocab * h

    @property
    def parameters(self) -> int:
        """All parameters, as `sum(p.numel())` counts them (biases and norms included)."""
        h, kv = self.hidden, self.kv_dim
        attn = 2 * h * h + 2 * h * kv + (h + 2 * kv)  # q, k, v biases; o has none
        per_layer = attn + 3 * h * self.intermediate + 2 * h  # two RMSNorms
        head = 0 if self.tied else self.vocab * h
        return self.layers * per_layer + self.vocab * h + head + h  # + the final norm

    def config(self) -> dict[str, object]:
        """A transformers Qwen2Config's fields for this shape."""
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "vocab_size": self.vocab,
            "tie_word_embeddings": self.tied,
            "max_position_embeddings": 32768,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "hidden_act": "silu",
            "use_sliding_window": False,
            "attention_dropout": 0.0,
        }


SHAPES = {
    # Qwen2.5's config.json files (hidden, intermediate, layers, heads, kv heads, vocab)
    "0.5B": Shape("Qwen2.5-0.5B", 896, 4864, 24, 14, 2, 151936),
    "1.5B": Shape("Qwen2.5-1.5B", 1536, 8960, 28, 12, 2, 151936),
    "3B": Shape("Qwen2.5-3B", 2048, 11008, 36, 16, 2, 151936),
    # the CPU rehearsal: the same code on a shape that trains in seconds (head_dim 64)
    "tiny": Shape("tiny", 128, 352, 2, 2, 1, 512),
}

DATASHEET_BF16_TFLOPS = {
    "H200 NVL": 835.5,
    "H200": 989.5,
    "H100 NVL": 835.5,
    "H100 PCIe": 756.5,
    "H100": 989.5,  # SXM: "NVIDIA H100 80GB HBM3"
    "A100": 312.0,
}
"""Dense bf16 tensor TFLOPS from NVIDIA's datasheets (half the 'with sparsity' figure),
matched by the first key found in the NVML name (longest names first)."""

DATASHEET_HBM_GBPS = {
    "H200 NVL": 4800.0,
    "H200": 4800.0,
    "H100 NVL": 3900.0,
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "A100": 2039.0,
}
"""HBM bandwidth (GB/s) from the same datasheets."""


def datasheet(table: dict[str, float], name: str | None) -> float | None:
    """The table's value for the first key contained in the device name, or None."""
    if not name:
        return None
    return next((value for key, value in table.items() if key in name), None)


@dataclass(frozen=True)
class StepTokens:
    """What one training step computes: its sequences' lengths, grouped by prompt."""

    prompt: int  # tokens of each group's prompt
    completions: tuple[tuple[int, ...], ...]  # per group, its completions' lengths

    @property
    def sequence_tokens(self) -> int:
        """Tokens as the sequences hold them (the prompt once per sequence)."""
        return sum(self.prompt * len(g) + sum(g) for g in self.completions)

    @property
    def model_tokens(self) -> int:
        """T: the prompt once per group, every completion token."""
        return sum(self.prompt + sum(g) for g in self.completions)


def train_flops(shape: Shape, step: StepTokens) -> float:
    """Model FLOPs of one training step (forward and backward), as the docstring defines."""
    dense = 6.0 * shape.matmul_params * step.model_tokens
    attention = 0.0
    for group in step.completions:
        for length in group:
            s = step.prompt + length
            attention += s * (s + 1)
    return dense + 6.0 * shape.layers * shape.hidden * attention


def mfu(flops: float, seconds: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation of one step (None without a peak)."""
    if not peak_tflops or seconds <= 0:
        return None
    return flops / seconds / (peak_tflops * 1e12)


def decode_bytes(shape: Shape, batch: int, context: int) -> float:
    """Bytes one bf16 decode step reads: the weights once, and `batch` KV caches of
    `context` tokens (keys and values, every layer)."""
    weights = 2.0 * shape.parameters
    kv = 2.0 * 2 * shape.layers * shape.kv_dim * context * batch
    return weights + kv


def decode_bound(shape: Shape, batch: int, new_tokens: int, prompt: int, gbps: float) -> float:
    """The bandwidth bound on tokens/s of `batch` sequences generating `new_tokens` each
    after a `prompt`-token prompt: batch * steps / the time to read every step's bytes."""
    seconds = sum(decode_bytes(shape, batch, prompt + t) for t in range(new_tokens)) / (gbps * 1e9)
    return batch * new_tokens / seconds
