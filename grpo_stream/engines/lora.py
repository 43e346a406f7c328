"""The generators' side of LoRA: apply a published adapter version (see
grpo_stream.models.adapter) to the hf engine's model, or hand it to vLLM as a LoRARequest.

Invariants:
- An adapter version is checked in full before anything is written: base-model fingerprint,
  rank/alpha/targets equal to what the engine holds, every tensor name and shape. A failed
  check raises AdapterError and leaves the engine on its previous version.
- hf, merge mode (the default, measured in bench/lora.py): the model gets peft's LoRA layers
  once (`inject_adapter_in_model`) and keeps a copy of each adapted base weight; a version
  restores those weights, writes the adapter and merges it, so generation runs at the base
  model's speed and versions never accumulate rounding (each merge starts from the copy).
  Adapter mode leaves the adapter unmerged (no copy, slower decode).
- vLLM: each version becomes a new LoRARequest (new id) loaded from a PEFT directory (vLLM
  loads adapters only from a path), added eagerly; new requests pass the current one, and an
  older adapter is removed (its directory deleted) once no request uses it
  (engines.vllm.update).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from grpo_stream.config.lora import LoraSettings
from grpo_stream.models.adapter import (
    FINGERPRINT_VALUES,
    PEFT_PREFIX,
    AdapterError,
    AdapterManifest,
    base_fingerprint,
    check_base,
    fingerprint_rows,
    lora_config,
)
from grpo_stream.models.loading import resolve_model

if TYPE_CHECKING:
    import torch

log = structlog.get_logger()

ADAPTER_NAME = "default"
"""peft's adapter name inside the hf engine's model."""
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""Values vLLM accepts for max_lora_rank."""


def settings_of(manifest: AdapterManifest) -> LoraSettings:
    """The LoRA settings an adapter version was trained with (no dropout: inference)."""
    return LoraSettings(
        enabled=True, r=manifest.r, alpha=manifest.alpha, target_modules=manifest.target_modules
    )


def module_name(peft_name: str) -> str:
    """`base_model.model.X.lora_A.weight` (PEFT file name) -> `X.lora_A.default.weight`."""
    if not peft_name.startswith(PEFT_PREFIX):
        raise AdapterError(f"adapter tensor {peft_name!r} is not in PEFT's file format")
    stem, leaf = peft_name[len(PEFT_PREFIX) :].rsplit(".", 1)
    return f"{stem}.{ADAPTER_NAME}.{leaf}"


class HFAdapter:
    """The hf engine's adapter: peft LoRA layers in its model, merged (default) or not."""

    def __init__(self, model: Any, merge: bool = True) -> None:
        self.model = model
        self.merge = merge
        self.model_name = str(model.name_or_path)
        self.fingerprint = base_fingerprint(model.named_parameters())  # before any injection
        self.manifest: AdapterManifest | None = None
        self._pristine: dict[str, torch.Tensor] = {}

    def apply(self, manifest: AdapterManifest, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Check the version in full, then write it (restoring and re-merging in merge mode)."""
        import torch

        check_base(manifest, self.fingerprint, self.model_name)
        if self.manifest is None:
            self._inject(manifest)
        elif _shape_of(self.manifest) != _shape_of(manifest):
            raise AdapterError(
                f"adapter version changes trainer.lora (r/alpha/target_modules) from "
                f"{_shape_of(self.manifest)} to {_shape_of(manifest)}; restart the generators"
            )
        plan = self._plan(tensors)
        layers = self._lora_layers()
        with torch.no_grad():
            if self.merge:
                for name, layer in layers.items():
                    if layer.merged:
                        layer.unmerge()
                    layer.get_base_layer().weight.copy_(self._pristine[name])
            for target, source in plan:
                target.copy_(source)
            if self.merge:
                for layer in layers.values():
                    layer.merge(adapter_names=[ADAPTER_NAME])
        self.manifest = manifest

    def _inject(self, manifest: AdapterManifest) -> None:
        from peft import inject_adapter_in_model

        config = lora_config(settings_of(manifest), inference=True)
        try:
            inject_adapter_in_model(config, self.model, adapter_name=ADAPTER_NAME)
        except ValueError as exc:
            raise AdapterError(f"adapter version does not fit this model: {exc}") from exc
        if self.merge:
            self._pristine = {
                name: layer.get_base_layer().weight.detach().clone()
                for name, layer in self._lora_layers().items()
            }
        log.info(
            "engine.lora_injected",
            r=manifest.r,
            targets=manifest.target_modules,
            merge=self.merge,
            layers=len(self._lora_layers()),
        )

    def _lora_layers(self) -> dict[str, Any]:
        from peft.tuners.lora import LoraLayer

        return {n: m for n, m in self.model.named_modules() if isinstance(m, LoraLayer)}

    def _plan(
        self, tensors: list[tuple[str, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        params = {n: p for n, p in self.model.named_parameters() if ".lora_" in n}
        plan, sent = [], set()
        for peft_name, tensor in tensors:
            name = module_name(peft_name)
            target = params.get(name)
            if target is None:
                raise AdapterError(f"adapter version has unknown tensor {peft_name!r}")
            if tuple(target.shape) != tuple(tensor.shape):
                raise AdapterError(
                    f"adapter tensor {peft_name!r} has shape {tuple(tensor.shape)}, "
                    f"the model's adapter expects {tuple(target.shape)}"
                )
            plan.append((target.data, tensor))
            sent.add(name)
        missing = sorted(set(params) - sent)
        if missing:
            raise AdapterError(f"adapter version is incomplete: {missing[0]!r} missing")
        return plan


def _shape_of(manifest: AdapterManifest) -> tuple[int, int, tuple[str, ...]]:
    return manifest.r, manifest.alpha, tuple(sorted(manifest.target_modules))


def write_peft_dir(
    manifest: AdapterManifest, tensors: list[tuple[str, torch.Tensor]], out: Path
) -> Path:
    """Write the version as a PEFT adapter directory (adapter_config.json and
    adapter_model.safetensors), the layout vLLM's and peft's loaders read."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = lora_config(settings_of(manifest), resolve_model(manifest.base_model), True)
    config.save_pretrained(str(out))
    save_file(
        {name: t.detach().cpu().contiguous() for name, t in tensors},
        str(out / "adapter_model.safetensors"),
        metadata={"format": "pt", "grpo_stream_manifest": manifest.model_dump_json()},
    )
    return out


def files_fingerprint(path: str) -> str:
    """`base_fingerprint` read from a model directory's safetensors files (for vLLM, whose
    workers hold the model in their own layout): only each tensor's leading rows are read."""
    from safetensors import safe_open

    rows = []
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                part = handle.get_slice(name)
                shape = [int(d) for d in part.get_shape()]
                if not shape:
                    rows.append((name, shape, handle.get_tensor(name)))
                    continue
                row = math.prod(shape[1:])
                rows.append((name, shape, part[: -(-FINGERPRINT_VALUES // max(row, 1))]))
    if not rows:
        raise AdapterError(f"model.name_or_path={path!r} has no safetensors files to fingerprint")
    return fingerprint_rows(rows)


class VLLMAdapter:
    """The vLLM engine's adapters: one LoRARequest per version. vLLM binds an adapter to a
    request for the request's whole life, so an adapter stays loaded (and its PEFT directory
    on disk, from which vLLM reloads an adapter it evicted) until `remove`, which the engine
    calls once no request uses it. `add` and `remove` are vLLM's `add_lora` and `remove_lora`."""

    def __init__(
        self,
        add: Callable[[Any], bool],
        remove: Callable[[int], bool],
        model_path: str,
        model_name: str,
    ) -> None:
        self._add = add
        self._remove = remove
        self.model_name = model_name
        self.fingerprint = files_fingerprint(model_path)
        self.request: Any = None  # the current version's; new requests use it
        self._next_id = 1
        self._dirs: dict[int, tempfile.TemporaryDirectory[str]] = {}

    def apply(
        self, manifest: AdapterManifest, tensors: list[tuple[str, torch.Tensor]], version: int
    ) -> Any:
        """Check the version, load it into vLLM as the current adapter; returns the one it
        replaces (None for the first), still loaded."""
        from vllm.lora.request import LoRARequest

        check_base(manifest, self.fingerprint, self.model_name)
        tmp = tempfile.TemporaryDirectory(prefix="grpo-lora-")
        path = write_peft_dir(manifest, tensors, Path(tmp.name) / f"v{version}")
        request = LoRARequest(f"v{version}", self._next_id, str(path))
        if not self._add(request):
            tmp.cleanup()
            raise AdapterError(f"vLLM refused adapter version {version}")
        self._next_id += 1
        self._dirs[request.lora_int_id] = tmp
        previous, self.request = self.request, request
        log.info("engine.lora_swapped", engine="vllm", version=version, lora_id=request.lora_int_id)
        return previous

    def remove(self, lora_id: int) -> None:
        """Unload an adapter no request uses any more, and delete its directory."""
        self._remove(lora_id)
        held = self._dirs.pop(lora_id, None)
        if held is not None:
            held.cleanup()

    def close(self) -> None:
        for held in self._dirs.values():
            held.cleanup()
        self._dirs.clear()


def vllm_lora_args(settings: LoraSettings) -> dict[str, Any]:
    """vLLM engine arguments for serving adapters of `settings`. A batch may hold requests of
    the current version, of the one before (requests submitted before a swap keep their
    adapter) and of the base model (before the first version): room for 3 distinct adapters
    (vLLM's rows were measured wrong with base rows beside a full set of adapter slots)."""
    rank = next((r for r in VLLM_RANKS if r >= settings.r), None)
    if rank is None:
        raise AdapterError(f"trainer.lora.r={settings.r} is over vLLM's largest LoRA rank 512")
    return {"enable_lora": True, "max_lora_rank": rank, "max_loras": 3}
