"""Where the trainer runs and in which precision: the settings resolved against the host,
and the checks that must fail, one line naming the setting, before any service starts.

The CUDA boundary is one record, `CudaProbe` (is CUDA visible, how many devices, do they
all support bf16), read once by `probe_cuda`; everything else here is a pure function of
the settings and that record, so the logic is tested on CPU hosts with the record made up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from grpo_stream.config import ConfigError, RunConfig
from grpo_stream.models.loading import resolve_model

if TYPE_CHECKING:
    from collections.abc import Callable

Mode = Literal["fp32", "bf16-mixed", "fp16-mixed", "bf16"]


@dataclass(frozen=True)
class CudaProbe:
    """What torch says about the host's GPUs."""

    available: bool
    device_count: int = 0
    bf16: bool = False
    """Every visible device supports bfloat16."""


def probe_cuda() -> CudaProbe:
    import torch

    if not torch.cuda.is_available():
        return CudaProbe(False)
    return CudaProbe(True, torch.cuda.device_count(), bool(torch.cuda.is_bf16_supported()))


def release_cache(device: str, colocated: bool, cuda: Any = None) -> bool:
    """Colocated placement (trainer and a vLLM generator sharing a GPU): give the caching
    allocator's free blocks back after each step, so the generator's KV cache can use them.
    `cuda` replaces torch.cuda (tests); True when the cache was released."""
    if not colocated or not device.startswith("cuda"):
        return False
    if cuda is None:
        import torch

        cuda = torch.cuda
    cuda.empty_cache()
    return True


def resolve_device(setting: str, cuda: CudaProbe, local_rank: int) -> str:
    """`cpu`, or `cuda:LOCAL_RANK` (one GPU per rank): auto takes CUDA when it is visible."""
    if setting == "cpu" or (setting == "auto" and not cuda.available):
        return "cpu"
    if not cuda.available:
        raise ConfigError(
            'trainer.device = "cuda" but this host has no usable CUDA device '
            '(torch.cuda.is_available() is false); set trainer.device = "cpu" or "auto"'
        )
    if local_rank >= cuda.device_count:
        raise ConfigError(
            f"trainer.device: rank {local_rank} has no GPU of its own ({cuda.device_count} "
            "visible); lower trainer.ranks or make more GPUs visible"
        )
    return f"cuda:{local_rank}"


def resolve_precision(setting: str, device: str, cuda: CudaProbe) -> Mode:
    """The precision mode: auto is bf16-mixed on GPUs (fp16-mixed where bf16 is missing)
    and fp32 on the CPU; bf16-mixed on a GPU without bf16 is an error."""
    gpu = device.startswith("cuda")
    if setting == "auto":
        if not gpu:
            return "fp32"
        return "bf16-mixed" if cuda.bf16 else "fp16-mixed"
    if setting in ("bf16-mixed", "bf16") and gpu and not cuda.bf16:
        raise ConfigError(
            f'trainer.precision = "{setting}" but this GPU has no bfloat16 support '
            '(compute capability < 8.0); set trainer.precision = "fp16-mixed" or "fp32"'
        )
    if setting in ("bf16-mixed", "bf16"):
        return "bf16-mixed" if setting == "bf16-mixed" else "bf16"
    return "fp16-mixed" if setting == "fp16-mixed" else "fp32"


def checkpointing_supported(name_or_path: str) -> bool:
    """Whether transformers can checkpoint the layers of this causal LM (from its config:
    no weights are loaded)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config = AutoConfig.from_pretrained(resolve_model(name_or_path))
    try:
        model_class: Any = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:  # not a causal LM: loading it fails later with transformers' own error
        return True
    return bool(model_class.supports_gradient_checkpointing)


def resolve(
    cfg: RunConfig, probe: Callable[[], CudaProbe] = probe_cuda, local_rank: int = 0
) -> tuple[str, Mode]:
    """The trainer's (device, precision mode), or a ConfigError naming the setting."""
    t = cfg.trainer
    cuda = CudaProbe(False) if t.device == "cpu" else probe()
    device = resolve_device(t.device, cuda, local_rank)
    precision = resolve_precision(t.precision, device, cuda)
    if precision == "fp16-mixed" and t.ranks > 1 and t.parallel == "fsdp2":
        raise ConfigError(
            'trainer.precision = "fp16-mixed" is not supported with trainer.parallel = '
            '"fsdp2"; use "bf16-mixed" or "fp32"'
        )
    if precision == "bf16":
        check_bf16(cfg)
    return device, precision


def check_bf16(cfg: RunConfig) -> None:
    """The combinations `trainer.precision = "bf16"` (bf16 weights, KahanAdamW) refuses."""
    t = cfg.trainer
    if cfg.model.dtype not in ("auto", "bfloat16"):
        raise ConfigError(
            f'trainer.precision = "bf16" trains bfloat16 weights but model.dtype = '
            f'"{cfg.model.dtype}"; set model.dtype = "auto" or use trainer.precision = "fp32"'
        )
    if t.lora.enabled:
        raise ConfigError(
            'trainer.precision = "bf16" is not supported with trainer.lora.enabled (the '
            'adapter would train in bf16); use trainer.precision = "bf16-mixed"'
        )
    if t.ranks > 1 and t.parallel == "fsdp2":
        raise ConfigError(
            'trainer.precision = "bf16" is not supported with trainer.parallel = "fsdp2"; '
            'use "bf16-mixed" or trainer.parallel = "ddp"'
        )


def trainer_preflight(
    cfg: RunConfig,
    probe: Callable[[], CudaProbe] = probe_cuda,
    can_checkpoint: Callable[[str], bool] = checkpointing_supported,
) -> None:
    """`up`'s checks of the trainer's settings before any service starts (a ConfigError
    naming the setting). It probes CUDA only when a setting could fail without it
    (device = cuda, or an explicit bf16-mixed on an auto device) and reads the model's
    config only when gradient checkpointing is on, so the default run imports neither
    torch nor transformers here."""
    t = cfg.trainer
    if t.device == "cuda" or (t.device == "auto" and t.precision == "bf16-mixed"):
        resolve(cfg, probe)
    else:
        resolve(cfg, lambda: CudaProbe(False))  # the CPU-side checks only
    if t.gradient_checkpointing and not can_checkpoint(cfg.model.name_or_path):
        raise ConfigError(
            f"trainer.gradient_checkpointing: {cfg.model.name_or_path} does not support "
            "activation checkpointing; set trainer.gradient_checkpointing = false"
        )
