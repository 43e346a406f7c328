"""bench.weights' synthetic weight set: Qwen2-shaped tensors (or a real model's state) whose
every element holds a known value per version, so a receiver proves which version it holds by
one probe number."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def qwen2_like_shapes(
    layers: int = 24,
    hidden: int = 896,
    intermediate: int = 4864,
    vocab: int = 151_936,
    heads: int = 14,
    kv_heads: int = 2,
) -> list[tuple[str, tuple[int, ...]]]:
    """Parameter names and shapes of a Qwen2 model (defaults: Qwen2-0.5B, tied embeddings)."""
    head_dim = hidden // heads
    kv = kv_heads * head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "self_attn.q_proj.weight", (hidden, hidden)),
            (p + "self_attn.q_proj.bias", (hidden,)),
            (p + "self_attn.k_proj.weight", (kv, hidden)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, hidden)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (hidden, hidden)),
            (p + "mlp.gate_proj.weight", (intermediate, hidden)),
            (p + "mlp.up_proj.weight", (intermediate, hidden)),
            (p + "mlp.down_proj.weight", (hidden, intermediate)),
            (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
        ]
    shapes.append(("model.norm.weight", (hidden,)))
    return shapes


def shape_bytes(shapes: list[tuple[str, tuple[int, ...]]], itemsize: int) -> int:
    total = 0
    for _, shape in shapes:
        n = 1
        for d in shape:
            n *= d
        total += n * itemsize
    return total


def fill_value(version: int, index: int) -> float:
    """The value every element of tensor `index` holds at `version` (exact in bf16)."""
    return ((version * 7 + index) % 64) / 4.0


def probe(tensors: list[torch.Tensor]) -> float:
    """Sum of the first element of each tensor: differs between versions."""
    return float(sum(float(t.reshape(-1)[0]) for t in tensors if t.numel()))


@dataclass
class Source:
    """What the trainer publishes: named tensors and a way to make the next version."""

    named: list[tuple[str, torch.Tensor]]
    unique: list[torch.Tensor]  # each storage once (tied weights counted once)

    def bump(self, version: int) -> float:
        """Change every tensor for `version`; returns the probe receivers must report."""
        import torch

        with torch.no_grad():
            for i, tensor in enumerate(self.unique):
                tensor.fill_(fill_value(version, i))
        return probe(self.unique)

    def nbytes(self) -> int:
        return int(sum(t.numel() * t.element_size() for t in self.unique))


def shapes_of(args: argparse.Namespace) -> list[tuple[str, tuple[int, ...]]]:
    return qwen2_like_shapes(
        layers=args.layers, hidden=args.hidden, intermediate=args.intermediate, vocab=args.vocab
    )


def _dtype(name: str) -> torch.dtype:
    import torch

    return torch.bfloat16 if name == "bf16" else torch.float32


def make_source(args: argparse.Namespace) -> Source:
    import torch

    if args.kind == "synthetic":
        tensors = [
            (name, torch.empty(shape, dtype=_dtype(args.dtype))) for name, shape in shapes_of(args)
        ]
        return Source(tensors, [t for _, t in tensors])
    from grpo_stream.models.loading import load_policy

    model = load_policy(args.model, dtype="float32", trainable=False)
    # The trainer publishes its state_dict: tied lm_head is in it and sent once (aliased).
    return Source(list(model.state_dict().items()), [p.data for p in model.parameters()])
