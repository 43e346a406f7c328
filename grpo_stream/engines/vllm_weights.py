"""The generator process's side of a vLLM weight update: fetch each version once, check it
against the model, write it where the workers read it.

Invariants:
- `VersionFetcher` fetches for the whole generator (one network fetch per version however many
  tensor-parallel workers vLLM runs): it holds the version's wire arrays (the `Replica`, base of
  the server's deltas, every tensor and the whole version checksummed) and, with
  `weights.relay`, serves what it receives to other generators (`Relay`), as the hf engine does.
  One fetch at a time.
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
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import zmq

from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.engines.base import to_torch
from grpo_stream.transport.fetch import Arrays, Replica
from grpo_stream.transport.relay import Relay

if TYPE_CHECKING:
    import torch

log = structlog.get_logger()

SHM = Path("/dev/shm")
TIED_HEAD = "lm_head.weight"


class VersionFetcher:
    """Fetches versions for one generator: delta base and relay kept between fetches."""

    def __init__(
        self, transport: TransportSettings, security: SecuritySettings, weights: WeightsSettings
    ) -> None:
        self._transport = transport
        self._security = security
        self._weights = weights
        self._ctx: zmq.Context[Any] | None = None
        self._replica = Replica()
        self._relay: Relay | None = None
        self._lock = threading.Lock()
        self.fetches = 0  # versions fetched over the network (one per version per generator)

    def fetch(self, address: str, version: int = -1) -> tuple[int, Arrays]:
        """`version` (-1: the newest) from `address`, as a delta from the one held when the
        server can; (version, tensors in the server's order)."""
        with self._lock:
            if self._ctx is None:
                self._ctx = zmq.Context()
            if self._weights.relay and self._relay is None:
                self._relay = Relay(
                    self._ctx, self._weights.relay_bind, self._transport, self._security,
                    wait_s=self._weights.relay_stall_s,
                )  # fmt: skip
            got = self._replica.fetch(
                self._ctx, address, self._transport, self._security, version=version,
                weights=self._weights, relay=self._relay,
            )  # fmt: skip
            self.fetches += 1
            return got, self._replica.named()

    def forget(self) -> None:
        """Drop the held version: the next fetch is a full one (after a refused update)."""
        with self._lock:
            self._replica = Replica()

    @property
    def relay_address(self) -> str | None:
        return None if self._relay is None else self._relay.address

    def close(self) -> None:
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None


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
