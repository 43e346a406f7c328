"""AdamW for bfloat16 weights (`trainer.precision = "bf16"`): fp32 moments, Kahan-summed updates.

With bf16 weights an AdamW update smaller than half a bf16 ulp of the weight (2^-9 relative)
rounds away: at lr 1e-5 on weights of magnitude ~0.02 most updates would be lost outright.
Three known remedies: an fp32 master copy (4 more bytes a parameter: the memory of
bf16-mixed, so no reason to pick this mode), stochastic rounding (unbiased only in
expectation: the run's noise grows and two runs from one seed differ with the RNG stream),
or Kahan summation. This optimizer uses Kahan summation: each parameter keeps a bf16
compensation buffer holding what the last rounding lost, and adds it to the next update, so
the weight plus its compensation tracks the fp32 trajectory to about bf16 precision squared,
deterministically (a rollback or a resume restores it exactly: it is optimizer state).

Memory per parameter: bf16 weight 2 + bf16 gradient 2 + compensation 2 + fp32 moments 8 =
14 bytes, against 16 (fp32 weight, gradient and moments 4+4+8) for fp32 and bf16-mixed.

Invariants: `exp_avg` and `exp_avg_sq` are float32 whatever the parameter dtype, also after
`load_state_dict` (torch's base class would cast them to the parameter's dtype); the update
is torch.optim.AdamW's (decoupled weight decay, bias-corrected moments) computed in float32.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

MOMENTS = ("exp_avg", "exp_avg_sq")


class KahanAdamW(torch.optim.Optimizer):
    """AdamW whose moments are float32 and whose low-precision weights are updated with
    Kahan compensation (see the module docstring)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("KahanAdamW.step takes no closure")
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    for key in MOMENTS:
                        state[key] = torch.zeros_like(p, dtype=torch.float32)
                    state["compensation"] = torch.zeros_like(p)
                state["step"] += 1
                step = float(state["step"])
                grad = p.grad.float()
                state["exp_avg"].lerp_(grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                bias1 = 1 - beta1**step
                bias2 = 1 - beta2**step
                denom = (state["exp_avg_sq"] / bias2).sqrt_().add_(group["eps"])
                weight = p.float()
                update = state["exp_avg"] / denom * (-group["lr"] / bias1)
                update.add_(weight, alpha=-group["lr"] * group["weight_decay"])
                _kahan_add(p, weight, update, state["compensation"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load, then the moments as saved (float32), not cast to the weights' dtype."""
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for index, saved in state_dict["state"].items():
            state = self.state[params[int(index)]]
            for key in MOMENTS:
                if key in saved:
                    state[key] = saved[key].to(params[int(index)].device, torch.float32, copy=True)


def _kahan_add(
    p: torch.Tensor, weight: torch.Tensor, update: torch.Tensor, compensation: torch.Tensor
) -> None:
    """p += update (float32) in p's dtype, carrying the rounding error in `compensation`.
    `weight` is p as float32 before the update."""
    wanted = update.add_(compensation.float())  # this step's update plus what was lost before
    p.copy_(weight + wanted)  # rounds to p's dtype
    compensation.copy_(wanted.sub_(p.float() - weight))  # what this rounding lost
