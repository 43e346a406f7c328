"""The trainer's optimizer: fused AdamW unsharded (the same update as the per-tensor loop)."""

from __future__ import annotations

import torch

from grpo_stream.training.setup import make_optimizer


def _params(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(7, 5, generator=gen)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    return params


def test_unsharded_adamw_runs_fused() -> None:
    opt = make_optimizer(_params(), 1e-3, 0.01, "fp32")
    assert opt.param_groups[0]["fused"] is True


def test_sharded_adamw_keeps_the_default_implementation() -> None:
    opt = make_optimizer(_params(), 1e-3, 0.01, "fp32", sharded=True)
    assert not opt.param_groups[0]["fused"]


def test_fused_update_equals_the_per_tensor_loop() -> None:
    fused, loop = _params(), _params()
    opt_fused = make_optimizer(fused, 1e-2, 0.01, "fp32")
    opt_loop = torch.optim.AdamW(loop, lr=1e-2, weight_decay=0.01, foreach=False)
    for _ in range(3):
        opt_fused.step()
        opt_loop.step()
    for a, b in zip(fused, loop, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
