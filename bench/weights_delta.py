"""Delta size of a weights version after real AdamW steps (part of `python -m bench.weights`).

The set: a Qwen2-0.5B-shaped list of tensors (`bench.weights_set.qwen2_like_shapes`, 494M
parameters), fp32 master weights initialised like a transformer (normal, std 0.02; norm
weights 1, biases 0), published as bf16 casts as the trainer publishes them. Each step is a
real `torch.optim.AdamW` step (lr as given, betas 0.9/0.999, eps 1e-8, weight decay 0.01) on
the gradient of a real loss per tensor, 0.5 * ||W - T||^2 towards a fixed random target T
(gradients dense, about 0.02 per element, far above eps, so Adam's update is about lr per
element, as in training; the first step, m / sqrt(v) = sign(g), is the largest). Not a
language-model loss: say so where quoted.

To stay within a few GiB, tensors are stepped one at a time, each with its own optimizer
state, and the delta of every step is encoded with exactly the server's encoder
(`grpo_stream.transport.delta.encode_delta`, zstd level as configured); a tensor whose delta
is not smaller travels raw. Wire bytes per version = sum over tensors of what would be sent.

Also printed: the fraction of bf16 elements that changed, and the same steps encoded as
index+value runs (uint32 gaps + uint16 values, zstd) to compare the two encodings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class DeltaTotals:
    """Bytes per step summed over tensors."""

    full: int = 0
    xor: list[int] = field(default_factory=list)
    runs: list[int] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)
    elements: int = 0


def _runs_bytes(old: np.ndarray[Any, Any], new: np.ndarray[Any, Any], level: int) -> int:
    """Bytes of the index+value encoding: zstd(uint32 gaps) + zstd(uint16 new values)."""
    from grpo_stream.transport.delta import compress

    idx = np.flatnonzero(old != new)
    if idx.size == 0:
        return 0
    gaps = np.diff(idx, prepend=0).astype("<u4")
    values = new.reshape(-1)[idx]
    return int(compress(gaps, level).nbytes + compress(values, level).nbytes)


def _init(name: str, shape: tuple[int, ...], gen: Any) -> Any:
    import torch

    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    return torch.randn(shape, generator=gen) * 0.02


def measure_deltas(
    shapes: list[tuple[str, tuple[int, ...]]], lr: float, steps: int, level: int, runs: bool
) -> DeltaTotals:
    """Step every tensor `steps` times with AdamW at `lr`; bytes each version would travel."""
    import torch

    from grpo_stream.protocols.arrays import from_torch
    from grpo_stream.transport.delta import encode_delta

    totals = DeltaTotals(xor=[0] * steps, runs=[0] * steps, changed=[0] * steps)
    gen = torch.Generator().manual_seed(0)
    for name, shape in shapes:
        weight = torch.nn.Parameter(_init(name, shape, gen))
        target = weight.detach() + torch.randn(shape, generator=gen) * 0.02
        opt = torch.optim.AdamW([weight], lr=lr, weight_decay=0.01)
        prev = from_torch(weight.detach().to(torch.bfloat16)).copy()
        totals.full += prev.nbytes
        totals.elements += prev.size
        for step in range(steps):
            opt.zero_grad()
            loss = 0.5 * (weight - target).pow(2).sum()
            loss.backward()
            opt.step()
            new = from_torch(weight.detach().to(torch.bfloat16)).copy()
            payload = encode_delta(prev, new, level)
            totals.xor[step] += new.nbytes if payload is None else payload.nbytes
            bits_old, bits_new = prev.view(np.uint16), new.view(np.uint16)
            if runs:
                totals.runs[step] += min(new.nbytes, _runs_bytes(bits_old, bits_new, level))
            totals.changed[step] += int(np.count_nonzero(bits_old != bits_new))
            prev = new
        del weight, target, opt
    return totals


def report(lr: float, totals: DeltaTotals, runs: bool) -> float:
    """Print one line per step; returns the median XOR+zstd ratio of the steps."""
    ratios = []
    for step, (xor, run_bytes, changed) in enumerate(
        zip(totals.xor, totals.runs, totals.changed, strict=True), start=1
    ):
        ratio = xor / totals.full
        ratios.append(ratio)
        also = f", index+value runs {run_bytes / totals.full:.4f}" if runs else ""
        print(
            f"  lr {lr:g} step {step}: {100 * changed / totals.elements:.2f}% of elements "
            f"changed; wire/full xor+zstd {ratio:.4f}{also}"
        )
    return float(np.median(ratios))
