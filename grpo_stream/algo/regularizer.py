"""The adaptive gradient-norm regularizer: proximal shrink toward tau, then a hard clip.

tau is an exponential moving average of the global gradient norm n = ||g||. When n > tau the
update uses the proximal step of the penalty P(x) = lambda/2 * (||x|| - tau)^2:

    prox(g) = argmin_x  lambda/2 * (||x|| - tau)^2 + 1/2 * ||x - g||^2

Derivation. For any x, ||x - g|| >= | ||x|| - ||g|| |, with equality when x = rho * g / n for
rho >= 0, and the penalty depends on ||x|| only; so the minimiser lies along g and its norm
rho minimises f(rho) = lambda/2 (rho - tau)^2 + 1/2 (rho - n)^2. f is a convex parabola with
f'(rho) = lambda (rho - tau) + (rho - n) = 0  =>  rho = (n + lambda * tau) / (1 + lambda),
a weighted mean of n and tau (so tau < rho <= n when n > tau). The step therefore scales g by
rho / n. Then the hard clip scales it to norm clip_factor * tau if it is still above that.
When n <= tau nothing changes.

Invariants:
- The norm is global: per-rank sums of squares are all-reduced (SUM) over torch.distributed
  when it is initialised and the gradients are sharded (FSDP-like: each rank holds distinct
  parameters; under FSDP2 the gradients are DTensors and each rank sums its local shard).
  With replicated, already-averaged gradients (DDP) pass `sharded=False`.
  Every rank computes the same norm, hence the same scale.
- tau is used first, then updated with the norm AFTER the shrink and clip:
  tau <- alpha * tau + (1 - alpha) * min(n, norm_after). A spike therefore moves tau by at
  most (1 - alpha) * (clip_factor - 1) * tau (x1.1 with the defaults), and a norm growing
  3x per step cannot drag the clip along with it.
  The first finite, non-zero norm sets tau to tau0, or to init_fraction * n if tau0 is None.
- A non-finite norm (a NaN, or finite gradients whose norm overflows float32 to inf) and a
  norm above explode_factor * tau (an explosion) change neither the gradients nor tau
  (`RegStats.finite` False, or `RegStats.exploded` True): the trainer skips that step and
  rolls back. An explosion is declared only once tau is a measured scale: tau0 was given, or
  more than `explode_after` finite steps were seen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from grpo_stream.collectives import collective_device
from grpo_stream.config.algo import RegularizerSettings


@dataclass(frozen=True)
class RegStats:
    """What one `GradRegularizer.apply` did (logged by the trainer)."""

    norm_before: float
    norm_after: float
    tau: float  # the tau this step used (nan before tau is set)
    fired: bool  # the proximal step applied (n > tau)
    clipped: bool  # the hard clip applied after it
    fired_frac: float  # fraction of finite steps so far on which it fired
    finite: bool
    scale: float  # factor the gradients were multiplied by
    exploded: bool = False  # norm > explode_factor * tau: nothing applied, roll back

    @property
    def skip(self) -> str | None:
        """Why the optimizer must not step ("non_finite_norm", "explosion"), else None."""
        if not self.finite:
            return "non_finite_norm"
        return "explosion" if self.exploded else None


def prox_norm(norm: float, tau: float, lam: float) -> float:
    """Norm after the proximal step of lambda/2 (||g|| - tau)^2 (see the module docstring)."""
    return (norm + lam * tau) / (1.0 + lam)


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (an FSDP2 parameter or gradient); other tensors as is."""
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor

        if isinstance(tensor, DTensor):
            return tensor.to_local()
    return tensor


def global_grad_norm(grads: list[torch.Tensor], sharded: bool = True) -> float:
    """L2 norm of all `grads` together, across ranks when sharded and distributed is up."""
    dist = torch.distributed
    distributed = sharded and dist.is_available() and dist.is_initialized()
    if grads:
        # a DTensor's own sum would all-reduce once per gradient: sum the local shards here
        # and all-reduce once below
        sq = torch.stack([local_shard(g).detach().float().pow(2).sum() for g in grads]).sum()
    else:  # a rank may hold no gradient; it still joins the all-reduce
        sq = torch.zeros((), device=collective_device())
    if distributed:
        sq = sq.to(collective_device())  # the gradients' device already, unless offloaded
        dist.all_reduce(sq, op=dist.ReduceOp.SUM)
    return math.sqrt(float(sq))


class GradRegularizer:
    """Keeps tau and applies the proximal shrink and hard clip to the gradients in place."""

    def __init__(self, settings: RegularizerSettings, *, sharded: bool = True) -> None:
        self.settings = settings
        self.sharded = sharded
        self.tau: float | None = settings.tau0
        self.steps = 0  # finite steps seen
        self.fired = 0  # steps on which the proximal step applied

    def apply(self, parameters: Iterable[torch.Tensor]) -> RegStats:
        """Regularize the `.grad` of `parameters` in place; returns what it did."""
        grads = [p.grad for p in parameters if p.grad is not None]
        norm = global_grad_norm(grads, self.sharded)
        if not math.isfinite(norm):
            return self._stats(norm, norm, math.nan, False, False, False, 1.0)
        if self.tau is None and norm > 0.0:
            self.tau = self.settings.init_fraction * norm
        tau = self.tau
        self.steps += 1
        if tau is None:  # all-zero gradients before tau was ever set: nothing to do
            return self._stats(norm, norm, math.nan, False, False, True, 1.0)
        explode = self.settings.explode_factor
        measured = self.settings.tau0 is not None or self.steps > self.settings.explode_after
        if explode is not None and measured and norm > explode * tau:
            self.steps -= 1  # not a step: it is skipped and rolled back
            return self._stats(norm, norm, tau, False, False, True, 1.0, exploded=True)
        fired = self.settings.enabled and norm > tau
        clipped = False
        target = norm
        if fired:
            target = prox_norm(norm, tau, self.settings.lam)
            cap = self.settings.clip_factor * tau
            clipped = target > cap
            target = min(target, cap)
            self.fired += 1
        scale = target / norm if fired else 1.0
        if fired:
            for g in grads:
                g.mul_(scale)
        self.tau = self.settings.alpha * tau + (1.0 - self.settings.alpha) * target
        return self._stats(norm, target, tau, fired, clipped, True, scale)

    def _stats(
        self,
        before: float,
        after: float,
        tau: float,
        fired: bool,
        clipped: bool,
        finite: bool,
        scale: float,
        exploded: bool = False,
    ) -> RegStats:
        return RegStats(
            norm_before=before,
            norm_after=after,
            tau=tau,
            fired=fired,
            clipped=clipped,
            fired_frac=self.fired / self.steps if self.steps else 0.0,
            finite=finite,
            scale=scale,
            exploded=exploded,
        )

    def raise_tau(self, factor: float) -> None:
        """Multiply tau by `factor` (the rollback guard's response to a blow-up)."""
        if self.tau is not None:
            self.tau *= factor

    def state_dict(self) -> dict[str, Any]:
        return {"tau": self.tau, "steps": self.steps, "fired": self.fired}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {"tau", "steps", "fired"} - set(state)
        if missing:
            raise KeyError(f"regularizer state lacks {sorted(missing)}")
        self.tau = None if state["tau"] is None else float(state["tau"])
        self.steps = int(state["steps"])
        self.fired = int(state["fired"])
