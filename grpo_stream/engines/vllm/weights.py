"""The generator process's side of a vLLM weight update: fetch each version once, check it
against the model, write it where the workers read it.

Invariants:
- The generator fetches each version once for all of vLLM's tensor-parallel workers, through
  the same `grpo_stream.transport.fetcher.VersionFetcher` as the hf engine (delta base, relay).
- `CheckpointShapes.check` refuses a full version whose names or shapes differ from the
  model's checkpoint, or that leaves a parameter out, before anything reaches vLLM (a tied
  `lm_head.weight` may be absent: the workers load it from the embedding).
- `write_handoff` writes one safetensors file (shared storage once) into RAM-backed /dev/shm
  when it has room, else the temp directory; the caller deletes it after the update.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from grpo_stream.engines.base import to_torch
from grpo_stream.transport.fetch import Arrays

if TYPE_CHECKING:
    import torch

log = structlog.get_logger()

SHM = Path("/dev/shm")
TIED_HEAD = "lm_head.weight"


class CheckpointShapes:
    """Names and shapes of the model's checkpoint tensors (its safetensors headers)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], tied: bool) -> None:
        self.shapes = shapes
        self.tied = tied

    @classmethod
    def of_directory(cls, path: str, tied: bool) -> CheckpointShapes:
        from safetensors import safe_open

        shapes: dict[str, tuple[int, ...]] = {}
        for file in sorted(Path(path).glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    shapes[name] = tuple(int(d) for d in handle.get_slice(name).get_shape())
        if not shapes:
            raise ValueError(f"model.name_or_path={path!r} has no safetensors files")
        return cls(shapes, tied)

    def check(self, named: Arrays) -> None:
        """Raise ValueError (naming the tensor) unless `named` is a whole version of this
        model: known names, equal shapes, nothing left out."""
        seen: set[str] = set()
        for name, array in named:
            want = self.shapes.get(name)
            if want is None:
                raise ValueError(f"weights version has tensor {name!r}, unknown to the model")
            if tuple(array.shape) != want:
                raise ValueError(
                    f"weights tensor {name!r} has shape {tuple(array.shape)}, the model's "
                    f"checkpoint {want}: is the trainer's model.name_or_path the generator's?"
                )
            seen.add(name)
        missing = sorted(set(self.shapes) - seen - ({TIED_HEAD} if self.tied else set()))
        if missing:
            raise ValueError(
                f"weights version is incomplete: {len(missing)} tensors missing, e.g. "
                f"{missing[0]!r}"
            )


def write_handoff(
    named: Arrays | list[tuple[str, torch.Tensor]], version: int
) -> tuple[Path, list[str]]:
    """The version as one safetensors file (shared storage once): its path and the names it
    holds, in the sender's order."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, value in named:
        tensor = to_torch(value)
        if tensor.data_ptr() in seen:  # a tied alias: safetensors refuses shared storage
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = tensor.detach().cpu().contiguous()
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    where = handoff_dir(size)
    handle, path = tempfile.mkstemp(prefix=f"grpo-v{version}-", suffix=".safetensors", dir=where)
    os.close(handle)
    save_file(tensors, path)
    return Path(path), list(tensors)


def handoff_dir(size: int) -> str:
    """/dev/shm when it exists with room for `size` bytes and a quarter more, else tmp."""
    if SHM.is_dir() and shutil.disk_usage(SHM).free > size * 5 // 4:
        return str(SHM)
    return tempfile.gettempdir()
