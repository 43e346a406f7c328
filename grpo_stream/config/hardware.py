"""Settings of device scoring, the score's refit, and the role plan.

Invariants: every weight is non-negative (the score is alpha*F + beta*B - gamma*L, so the
latency term can only lower a score); reference values are fixed constants, never derived
from the devices present, so a device's features do not move when another device joins.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class HardwareSettings(BaseModel):
    """How devices are scored, when the score is refit, and how roles are planned."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    alpha: float = Field(default=0.5, ge=0)
    """Default weight of compute (peak bf16 tensor TFLOPS / flops_ref_tflops)."""
    beta: float = Field(default=1.0, ge=0)
    """Default weight of memory bandwidth (GB/s / bandwidth_ref_gbps); decode is bandwidth-bound."""
    gamma: float = Field(default=1.0, ge=0)
    """Default weight of the hub round trip (seconds / latency_ref_s), subtracted."""
    flops_ref_tflops: float = Field(default=100.0, gt=0)
    """Reference compute: 100 TFLOPS counts as 1.0 (about an L4 x 0.8, an H100 SXM x 10)."""
    bandwidth_ref_gbps: float = Field(default=1000.0, gt=0)
    """Reference memory bandwidth: 1 TB/s counts as 1.0."""
    latency_ref_s: float = Field(default=0.01, gt=0)
    """Reference hub round trip: 10 ms counts as 1.0 (loopback is about 0.01)."""
    refit_min_samples: int = Field(default=8, ge=1)
    """Throughput reports needed (all devices together) before the weights are refit."""
    refit_min_devices: int = Field(default=2, ge=1)
    """Distinct devices needed among those reports before the weights are refit."""
    max_samples_per_device: int = Field(default=64, ge=1)
    """Most recent throughput reports kept per device (bounds memory)."""
    weight_max: float = Field(default=1e9, gt=0)
    """Upper bound of each refit weight (the fit is box-constrained to [0, weight_max])."""
    trainer_bytes_per_param: float = Field(default=18.0, gt=0)
    """Trainer bytes per parameter: bf16 weights 2 + fp32 master 4 + fp32 grads 4 + AdamW 8."""
    trainer_headroom: float = Field(default=0.2, ge=0)
    """Extra fraction of trainer memory for activations, buffers and fragmentation."""
    trainer_sharded: bool = False
    """Trainer ranks shard weights, gradients and optimizer state (FSDP / ZeRO-3), so each
    device needs 1/trainer_devices of the state; False is data parallel (full state each)."""
    generator_bytes_per_param: float = Field(default=2.0, gt=0)
    """Generator memory per parameter: bf16 weights."""
    generator_headroom: float = Field(default=0.5, ge=0)
    """Extra fraction of generator memory for the KV cache and activations (also budgeted
    for the evaluator's policy and every reward model placed on a GPU)."""
    process_overhead_gib: float = Field(default=0.5, ge=0, le=16)
    """GPU memory each process takes before any tensor (its CUDA context, 0.3-0.6 GiB on
    recent GPUs): budgeted once per evaluator and per reward worker placed on a GPU."""
    benchmark_seconds: float = Field(default=0.2, gt=0, le=1.0)
    """Time budget of each CPU micro-benchmark (matmul, copy) when there is no NVML."""

    @model_validator(mode="after")
    def _check(self) -> HardwareSettings:
        if self.alpha == 0 and self.beta == 0:
            raise ValueError("hardware.alpha and hardware.beta cannot both be 0")
        return self
