"""Export a LoRA checkpoint: the adapter alone (PEFT format), or merged into its base model
as a plain Hugging Face model that transformers and vLLM load without peft.

A LoRA checkpoint is a step directory holding adapter_config.json (which names the base
model), adapter_model.safetensors, the tokenizer and trainer_state.pt
(grpo_stream.training.lora). Nothing is written to OUT unless the export succeeds: it is
assembled in a temporary sibling directory and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import structlog
import torch

from grpo_stream.models.adapter import AdapterError
from grpo_stream.models.loading import Dtype, load_policy, resolve_model, torch_dtype
from grpo_stream.training.checkpoint import MARKER, latest_checkpoint

log = structlog.get_logger()

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def find_adapter_checkpoint(path: Path) -> Path:
    """`path` itself when it is a complete checkpoint, else the newest one of the run dir
    `path`; it must hold a LoRA adapter (AdapterError otherwise, one line)."""
    ckpt = path if (path / MARKER).exists() else latest_checkpoint(path)
    if ckpt is None:
        raise AdapterError(f"{path} is neither a checkpoint nor a run directory with one")
    if not (ckpt / ADAPTER_FILES[0]).exists():
        raise AdapterError(
            f"{ckpt} is not a LoRA checkpoint (no adapter_config.json): it already holds "
            "the full model, which transformers loads as it is"
        )
    return ckpt


def base_of(ckpt: Path) -> str:
    """The base model the adapter of `ckpt` was trained on (from adapter_config.json)."""
    name = json.loads((ckpt / ADAPTER_FILES[0]).read_text()).get("base_model_name_or_path")
    if not name:
        raise AdapterError(f"{ckpt}/adapter_config.json names no base model: pass --base")
    return str(name)


def export(
    ckpt_or_run: Path,
    out: Path,
    merge: bool,
    base: str | None = None,
    dtype: Dtype = "auto",
) -> Path:
    """Write the adapter (merge=False) or the merged model (merge=True) of a checkpoint;
    `dtype` of the merged weights ("auto": the base model's own, from its config.json)."""
    ckpt = find_adapter_checkpoint(ckpt_or_run)
    if out.exists() and any(out.iterdir()):
        raise AdapterError(f"{out} exists and is not empty: choose a new output directory")
    tmp = out.parent / f".tmp-export-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if merge:
            _write_merged(ckpt, tmp, base or base_of(ckpt), dtype)
        else:
            for name in ADAPTER_FILES:
                shutil.copy2(ckpt / name, tmp / name)
        for name in TOKENIZER_FILES:
            if (ckpt / name).exists():
                shutil.copy2(ckpt / name, tmp / name)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("lora.exported", checkpoint=str(ckpt), out=str(out), merged=merge)
    return out


def _write_merged(ckpt: Path, out: Path, base: str, dtype: Dtype) -> None:
    """Base + adapter merged in fp32, saved in `dtype`."""
    from peft import PeftModel

    model: Any = load_policy(base, dtype="float32", device="cpu", trainable=False)
    if dtype == "auto":
        saved_dtype = _config_dtype(Path(resolve_model(base)))
    else:
        saved_dtype = torch_dtype(dtype, "cpu")
    merged = PeftModel.from_pretrained(model, ckpt).merge_and_unload()
    if saved_dtype is not None:
        merged = merged.to(saved_dtype)
    merged.save_pretrained(out, safe_serialization=True)


def _config_dtype(path: Path) -> Any:
    """The torch dtype the base model's config.json records (None if it records none)."""
    config = path / "config.json"
    if not config.exists():
        return None
    data = json.loads(config.read_text())
    name = data.get("dtype") or data.get("torch_dtype")
    return getattr(torch, name) if isinstance(name, str) and hasattr(torch, name) else None
