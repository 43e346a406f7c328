"""Mixed precision of the trainer's forward and backward (`trainer.precision`).

- fp32: nothing changes.
- bf16-mixed: fp32 weights, gradients and optimizer state; the model's forward runs under
  bf16 autocast on the trainer's device (CPU autocast on a CPU), so does its backward.
- bf16: the weights themselves are bfloat16 (no autocast); the optimizer is KahanAdamW
  (training/bf16.py: float32 moments, compensated updates), chosen by TrainState.create.
- fp16-mixed: fp16 autocast and a gradient scaler: the loss is scaled before backward and
  the gradients unscaled before the regularizer sees them. A step whose gradients
  overflowed is skipped and counted (`overflow_skips`), the scale shrinks; it is not an
  explosion and nothing rolls back.

Invariant: log-probs, the loss and the KL are float32 whatever the mode: algo/logprobs.py
takes the logits to float32 with autocast off, and every input of the loss is then float32
(the loss has no op that autocast lowers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

from grpo_stream.training.device import Mode


class Precision:
    """Autocast, loss scaling and overflow skips of one trainer."""

    def __init__(self, mode: Mode, device: str) -> None:
        self.mode = mode
        self.device_type = torch.device(device).type
        self.scaler = torch.amp.GradScaler(self.device_type) if mode == "fp16-mixed" else None
        self.overflow_skips = 0

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context the model's forward runs in."""
        if self.mode in ("fp32", "bf16"):
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.mode == "bf16-mixed" else torch.float16
        return torch.autocast(self.device_type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        scaled = loss if self.scaler is None else self.scaler.scale(loss)
        scaled.backward()  # type: ignore[no-untyped-call]

    def unscale(self, optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> bool:
        """Unscale the gradients in place; False when they overflowed: the caller skips the
        step and calls `skip`."""
        if self.scaler is None:
            return True
        self.scaler.unscale_(optimizer)
        grads = [p.grad for p in params if p.grad is not None]
        return bool(torch.isfinite(torch.nn.utils.get_total_norm(grads)))

    def skip(self) -> None:
        """An overflowed step: shrink the scale, count it."""
        if self.scaler is not None:
            self.scaler.update()
        self.overflow_skips += 1

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step (through the scaler in fp16-mixed)."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()
