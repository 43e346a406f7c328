"""LoRA training with peft: wrap the policy, use it as its own reference, publish the adapter.

Invariants (with `trainer.lora.enabled`):
- Only the adapter's parameters require grad, so only they are in the optimizer, in the
  regularizer's global norm, in DDP's all-reduce (DDP skips parameters without grad) and
  changed by a step; the base weights never change.
- The reference model (beta > 0) is the policy with its adapter disabled (`disable_adapter`):
  the frozen base itself, no second copy in memory.
- A checkpoint holds the adapter in PEFT's format (adapter_config.json naming the base model,
  adapter_model.safetensors); resuming loads the base from `model.name_or_path` and the
  adapter from the checkpoint.
- A published version is the adapter tensors plus their manifest (grpo_stream.models.adapter).

peft and torch are imported inside functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from grpo_stream.config.lora import LoraSettings
from grpo_stream.models.adapter import (
    MANIFEST_NAME,
    AdapterError,
    AdapterManifest,
    base_fingerprint,
    lora_config,
    manifest_tensor,
)
from grpo_stream.models.loading import resolve_model

if TYPE_CHECKING:
    import torch

log = structlog.get_logger()


@dataclass(frozen=True)
class LoraPolicy:
    """What the trainer knows about the adapter it trains (the model itself is the state's)."""

    settings: LoraSettings
    base_model: str
    fingerprint: str

    def named_weights(self, model: Any) -> Iterator[tuple[str, torch.Tensor]]:
        """The version to publish: the adapter tensors (PEFT file names), then the manifest."""
        tensors = adapter_state(model)
        manifest = AdapterManifest(
            r=self.settings.r,
            alpha=self.settings.alpha,
            scaling=self.settings.scaling,
            target_modules=list(self.settings.target_modules),
            base_model=self.base_model,
            base_fingerprint=self.fingerprint,
            tensors={name: list(t.shape) for name, t in tensors.items()},
        )
        yield from tensors.items()
        yield MANIFEST_NAME, manifest_tensor(manifest)


def check_targets(model: Any, config: Any) -> None:
    """Raise AdapterError unless `target_modules` names at least one module of `model`."""
    import torch
    from peft.tuners.tuners_utils import check_target_module_exists

    if not any(check_target_module_exists(config, name) for name, _ in model.named_modules()):
        linear = sorted(
            {
                n.rsplit(".", 1)[-1]
                for n, mod in model.named_modules()
                if isinstance(mod, torch.nn.Linear)
            }
        )
        raise AdapterError(
            f"trainer.lora.target_modules={sorted(config.target_modules)} names no module of "
            f"the model; its linear layers are {linear}"
        )


def wrap_policy(
    model: Any, settings: LoraSettings, base_model: str, adapter_dir: Path | None
) -> tuple[Any, LoraPolicy]:
    """(the peft-wrapped policy, its LoraPolicy): a fresh adapter, or the one in `adapter_dir`.

    Raises AdapterError (one line naming trainer.lora) when the targets match nothing or
    peft cannot adapt the matched modules.
    """
    from peft import PeftModel, get_peft_model

    fingerprint = base_fingerprint(model.named_parameters())
    config = lora_config(settings, resolve_model(base_model))
    check_targets(model, config)
    try:
        if adapter_dir is None:
            wrapped = get_peft_model(model, config)
        else:
            wrapped = PeftModel.from_pretrained(
                model, adapter_dir, is_trainable=True, config=config
            )
    except (ValueError, TypeError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AdapterError(f"trainer.lora: peft cannot adapt this model: {first}") from exc
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    total = sum(p.numel() for p in wrapped.parameters())
    log.info(
        "lora.wrapped",
        r=settings.r,
        alpha=settings.alpha,
        targets=list(settings.target_modules),
        trainable=trainable,
        total=total,
        resumed=adapter_dir is not None,
        fingerprint=fingerprint,
    )
    return wrapped, LoraPolicy(settings, base_model, fingerprint)


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's tensors under PEFT's file names (the live parameters, not copies)."""
    from peft import get_peft_model_state_dict

    state: dict[str, torch.Tensor] = get_peft_model_state_dict(model)
    return state


class AdapterDisabled:
    """The reference model: the policy called with its adapter disabled (the frozen base).

    Saves a second copy of the base model: `saved_bytes` of memory.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.saved_bytes = sum(
            p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad
        )

    @property
    def config(self) -> Any:
        return self.model.config

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)
