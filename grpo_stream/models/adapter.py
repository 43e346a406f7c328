"""LoRA adapters: the `trainer.lora` settings and what a published adapter version carries.

With `trainer.lora.enabled` a published weights version is the adapter only: its tensors under
PEFT's file names (`base_model.model.<module>.lora_A.weight`, `...lora_B.weight`, as in an
`adapter_model.safetensors`) plus one uint8 tensor named `MANIFEST_NAME` holding the JSON of
an `AdapterManifest` (rank, alpha, scaling, target modules, tensor names and shapes, and a
fingerprint of the base model the adapter belongs to).

Invariants:
- The weight server needs no change: the manifest travels as a tensor of the version, so a
  version and its manifest can never come apart.
- `base_fingerprint` depends on the base model's parameter names, shapes and leading values
  (rounded to bfloat16), not on the dtype it was loaded in, so a trainer in fp32 and a
  generator in bf16 of the same checkpoint agree, and any other base model disagrees.

Nothing here imports torch at import time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpo_stream.config.lora import LoraSettings

if TYPE_CHECKING:
    import torch

MANIFEST_NAME = "__lora_manifest__"
"""Name of the manifest tensor inside a published adapter version."""
PEFT_PREFIX = "base_model.model."
"""Prefix of every tensor name in PEFT's adapter file format."""
FINGERPRINT_VALUES = 256
"""Leading values of each base tensor that enter the fingerprint."""


class AdapterError(ValueError):
    """A LoRA setting, model or adapter version is unusable; the message is one line."""


class AdapterManifest(BaseModel):
    """What a generator needs to apply an adapter version, published with its tensors."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(ge=1)
    alpha: int = Field(ge=1)
    scaling: float = Field(gt=0)
    target_modules: list[str]
    base_model: str
    """The base model's name or path, as the trainer's config names it."""
    base_fingerprint: str
    """`base_fingerprint` of the base model the adapter was trained on."""
    tensors: dict[str, list[int]]
    """Every adapter tensor of the version (PEFT file names) and its shape."""


def manifest_tensor(manifest: AdapterManifest) -> torch.Tensor:
    """The manifest as the uint8 tensor that travels with the version."""
    import torch

    blob = manifest.model_dump_json().encode()
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def split_adapter(
    items: list[tuple[str, torch.Tensor]],
) -> tuple[AdapterManifest, list[tuple[str, torch.Tensor]]] | None:
    """(manifest, the adapter tensors) when `items` is an adapter version, else None.

    Raises AdapterError when the manifest does not parse or does not list exactly the
    tensors that came, with their shapes.
    """
    blobs = [value for name, value in items if name == MANIFEST_NAME]
    if not blobs:
        return None
    data = blobs[0].numpy().tobytes()
    try:
        manifest = AdapterManifest.model_validate_json(data)
    except ValidationError as exc:
        raise AdapterError(f"adapter version has a malformed manifest: {exc.errors()[0]}") from exc
    tensors = [(name, value) for name, value in items if name != MANIFEST_NAME]
    got = {name: list(value.shape) for name, value in tensors}
    if got != manifest.tensors:
        missing = sorted(set(manifest.tensors) ^ set(got))
        raise AdapterError(
            f"adapter version's tensors do not match its manifest (e.g. {missing[:1] or got})"
        )
    return manifest, tensors


def base_fingerprint(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """A short hash of a base model's parameters: names, shapes and leading values in bf16.

    `named` are (name, tensor) of the plain (un-adapted) model, each tied parameter once
    (order does not matter: names are sorted).
    """
    return fingerprint_rows(
        (name, list(t.shape), t.detach().reshape(-1)[:FINGERPRINT_VALUES]) for name, t in named
    )


def fingerprint_rows(rows: Iterable[tuple[str, list[int], torch.Tensor]]) -> str:
    """`base_fingerprint` from (name, full shape, leading values of the flattened tensor)."""
    import torch

    digest = hashlib.sha256()
    lines = []
    for name, shape, head in rows:
        values = head.reshape(-1)[:FINGERPRINT_VALUES].to("cpu", torch.bfloat16)
        lines.append(json.dumps([name, shape, values.view(torch.int16).tolist()]))
    for line in sorted(lines):
        digest.update(line.encode())
    return digest.hexdigest()[:16]


def check_base(manifest: AdapterManifest, fingerprint: str, model: str) -> None:
    """Raise AdapterError (one line naming the setting) when the adapter is for another base."""
    if manifest.base_fingerprint != fingerprint:
        raise AdapterError(
            f"adapter for base model {manifest.base_model!r} (fingerprint "
            f"{manifest.base_fingerprint}) does not fit this generator's model.name_or_path="
            f"{model!r} (fingerprint {fingerprint}); give both services the same base model"
        )


def lora_config(
    settings: LoraSettings, base_path: str | None = None, inference: bool = False
) -> Any:
    """The peft LoraConfig for `settings` (no dropout when used for inference)."""
    from peft import LoraConfig

    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=0.0 if inference else settings.dropout,
        target_modules=list(settings.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_path,
        inference_mode=inference,
    )
