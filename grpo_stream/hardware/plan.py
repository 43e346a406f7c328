"""Assign roles: which devices train and which generate, and each generator's share.

Memory rule (documented in HardwareSettings):
    trainer   needs params x 18 bytes x (1 + 0.2): bf16 weights 2 + fp32 master weights 4 +
              fp32 gradients 4 + AdamW moments 8 bytes per parameter (pure fp32 training
              needs 16; 18 covers both), plus 20% for activations and fragmentation. Every
              trainer rank holds the full state (data parallel), so this is per device,
              unless `trainer_sharded` (FSDP / ZeRO-3) divides it by trainer_devices.
    generator needs params x 2 bytes x (1 + 0.5): bf16 weights plus room for the KV cache.

The trainer gets the devices with the most memory, ties broken by compute then bandwidth
(the ranks are not placed for locality). Every other device that fits a generator
generates, with a share of the work proportional to its score; the rest are idle with a
reason. When no device is left to generate, the trainer devices also generate
(`colocated`), if they hold both. Invariants: a device has exactly one entry; generator
shares sum to 1; every generator gets >= 1 credit; a plan that cannot train is an error
(PlanError), never a plan without a trainer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from grpo_stream.config.hardware import HardwareSettings
from grpo_stream.hardware.device import DeviceFingerprint
from grpo_stream.hardware.score import Features, ScoreModel, credits_for, work_shares

GIB = 2**30


class PlanError(ValueError):
    """No valid plan: the message is one line saying what is missing."""


@dataclass(frozen=True)
class Assignment:
    """One device's role."""

    device_id: str
    host: str
    index: int
    name: str
    memory_gib: float | None
    tflops: float | None
    bandwidth_gbps: float | None
    score: float
    share: float = 0.0
    credits: int = 0
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    """Roles for a cluster; JSON-able with `to_dict`."""

    model_params: int
    trainer_memory_bytes: int
    generator_memory_bytes: int
    trainer: list[Assignment]
    generators: list[Assignment]
    idle: list[Assignment]
    colocated: bool
    rule: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _memory(device: DeviceFingerprint) -> int:
    return device.memory_total_bytes or 0


def _trainer_key(device: DeviceFingerprint) -> tuple[int, float, float, str]:
    compute = device.compute_tflops or 0.0
    bandwidth = device.memory_bandwidth_gbps or 0.0
    return (-_memory(device), -compute, -bandwidth, device.device_id)


def _assign(device: DeviceFingerprint, score: float, **extra: Any) -> Assignment:
    return Assignment(
        device_id=device.device_id,
        host=device.host,
        index=device.index,
        name=device.name,
        memory_gib=device.memory_gib,
        tflops=device.compute_tflops,
        bandwidth_gbps=device.memory_bandwidth_gbps,
        score=score,
        **extra,
    )


def _pick_trainer(
    devices: list[DeviceFingerprint], need: int, count: int, params: int
) -> list[DeviceFingerprint]:
    ranked = sorted(devices, key=_trainer_key)
    fit = [d for d in ranked if _memory(d) >= need]
    if len(fit) < count:
        best = ranked[0]
        raise PlanError(
            f"the trainer needs {count} device(s) with >= {need / GIB:.1f} GiB for "
            f"{params:,} params; {len(fit)} have it (largest: {best.name} on "
            f"{best.device_id}, {_memory(best) / GIB:.1f} GiB)"
        )
    return fit[:count]


def _generators(
    gens: list[DeviceFingerprint], scores: dict[str, float], base_credits: int
) -> list[Assignment]:
    """Generator entries, best score first, with shares and credits."""
    shares = work_shares({d.device_id: scores[d.device_id] for d in gens})
    out = [
        _assign(
            d,
            scores[d.device_id],
            share=shares[d.device_id],
            credits=credits_for(shares[d.device_id], base_credits, len(gens)),
        )
        for d in gens
    ]
    return sorted(out, key=lambda a: (-a.score, a.device_id))


def memory_needs(
    model_params: int, trainer_devices: int, settings: HardwareSettings
) -> tuple[int, int]:
    """(bytes a trainer device needs, bytes a generator device needs); see the module docstring."""
    s = settings
    trainer = int(model_params * s.trainer_bytes_per_param * (1 + s.trainer_headroom))
    if s.trainer_sharded:
        trainer //= trainer_devices
    generator = int(model_params * s.generator_bytes_per_param * (1 + s.generator_headroom))
    return trainer, generator


def _rule(s: HardwareSettings, trainer_devices: int, model: ScoreModel) -> str:
    w = model.weights
    per = f" / {trainer_devices} (sharded)" if s.trainer_sharded else " per device"
    return (
        f"trainer: params x {s.trainer_bytes_per_param} B x {1 + s.trainer_headroom:g}{per}; "
        f"generator: params x {s.generator_bytes_per_param} B x {1 + s.generator_headroom:g}; "
        f"shares by HPM = {w.alpha:g}*F + {w.beta:g}*B - {w.gamma:g}*L"
    )


def plan_roles(
    devices: list[DeviceFingerprint],
    model_params: int,
    trainer_devices: int = 1,
    *,
    latency_s: dict[str, float] | None = None,
    settings: HardwareSettings | None = None,
    base_credits: int = 16,
    model: ScoreModel | None = None,
) -> Plan:
    """Roles for `devices` training a `model_params` model (see the module docstring).

    latency_s: hub round trip per device_id (default 0). model: a refit ScoreModel to
    score with (default: a fresh one with `settings`' weights).
    """
    if not devices:
        raise PlanError("no devices to plan for")
    if model_params < 1 or trainer_devices < 1:
        raise PlanError("model_params and trainer_devices must be >= 1")
    s = settings or HardwareSettings()
    model = model or ScoreModel(s)
    need_t, need_g = memory_needs(model_params, trainer_devices, s)
    latency = latency_s or {}
    scores = {
        d.device_id: model.score(Features.of(d, latency.get(d.device_id, 0.0))) for d in devices
    }
    trainer = _pick_trainer(devices, need_t, trainer_devices, model_params)
    chosen = {d.device_id for d in trainer}
    rest = [d for d in devices if d.device_id not in chosen]
    gens = [d for d in rest if _memory(d) >= need_g]
    idle = [
        _assign(d, scores[d.device_id], reason=f"needs >= {need_g / GIB:.1f} GiB to generate")
        for d in rest
        if _memory(d) < need_g
    ]
    colocated = not gens
    if colocated:
        gens = [d for d in trainer if _memory(d) >= need_t + need_g]
        if not gens:
            raise PlanError(
                f"no device left to generate: add a device with >= {need_g / GIB:.1f} GiB, "
                f"or give a trainer device >= {(need_t + need_g) / GIB:.1f} GiB to do both"
            )
    return Plan(
        model_params=model_params,
        trainer_memory_bytes=need_t,
        generator_memory_bytes=need_g,
        trainer=[_assign(d, scores[d.device_id]) for d in trainer],
        generators=_generators(gens, scores, base_credits),
        idle=idle,
        colocated=colocated,
        rule=_rule(s, trainer_devices, model),
    )
