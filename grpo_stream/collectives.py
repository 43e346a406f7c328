"""The trainer's process group and the device its collectives use (below training and algo,
which both call collectives).

NCCL (the ranks' tensors on GPUs) takes CUDA tensors only, and each rank's on its own GPU;
gloo (CPU ranks) takes CPU tensors. A tensor made without naming its device lands on the
CPU, so on a GPU rank it fails the first collective it is given, while every CPU test
passes. Hence one owner for that device:

Invariants:
- Every tensor grpo_stream hands to a torch.distributed collective (training/fsdp.py,
  algo/regularizer.py, algo/rollback.py) is made on, or moved to, `collective_device()`:
  the rank's current CUDA device under NCCL (`TrainState.create` sets it to the trainer's
  own, cuda:LOCAL_RANK), else the CPU.
- Under NCCL the process group is bound to that device when it is created (`device_id`),
  so a barrier or an object collective never guesses GPU 0.
Tested on CPU hosts by a strict gloo that refuses tensors off the trainer's device
(tests/unit/training/test_collective_devices.py; the NCCL side with torch.distributed and
CUDA replaced at their boundary in tests/unit/test_collectives.py).
"""

from __future__ import annotations

import os

import torch


def process_group_backend(device: str) -> str:
    """NCCL when the ranks' tensors are on GPUs, gloo on the CPU."""
    return "nccl" if device.startswith("cuda") else "gloo"


def init_distributed(device: str) -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; joins the process group if > 1:
    NCCL bound to `device` when the ranks' tensors are on GPUs, gloo on the CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dist = torch.distributed
    if world > 1 and not dist.is_initialized():
        backend = process_group_backend(device)
        bound = torch.device(device) if backend == "nccl" else None
        dist.init_process_group(backend, device_id=bound)
    return rank, world


def collective_device() -> torch.device:
    """The device a collective's tensors must be on: the current CUDA device when the
    process group is NCCL's, else the CPU (gloo, or no process group)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
