"""The process group's device on a GPU rank, with torch.distributed and CUDA replaced at their
boundary (no GPU here): NCCL's collectives use the rank's current GPU, the group is bound to
the trainer's device when it is created, and CPU ranks stay on gloo and the CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from grpo_stream.collectives import collective_device, init_distributed, process_group_backend


def test_nccl_for_gpu_ranks_and_gloo_on_the_cpu() -> None:
    assert process_group_backend("cuda:3") == "nccl"
    assert process_group_backend("cpu") == "gloo"


def test_without_a_process_group_collectives_use_the_cpu() -> None:
    assert not torch.distributed.is_initialized()
    assert collective_device() == torch.device("cpu")


def _group(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """torch.distributed as a rank inside a `backend` group sees it."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: backend)


def test_an_nccl_rank_collects_on_its_current_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _group(monkeypatch, "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert collective_device() == torch.device("cuda", 3)


def test_a_gloo_rank_collects_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _group(monkeypatch, "gloo")
    assert collective_device() == torch.device("cpu")


def _joined(monkeypatch: pytest.MonkeyPatch, rank: int, world: int) -> list[dict[str, Any]]:
    """Calls of init_process_group, for a torchrun rank (RANK, WORLD_SIZE set)."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)

    def init(backend: str, **kwargs: Any) -> None:
        calls.append({"backend": backend, **kwargs})

    monkeypatch.setattr(torch.distributed, "init_process_group", init)
    return calls


def test_a_gpu_rank_binds_its_nccl_group_to_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _joined(monkeypatch, rank=1, world=2)
    assert init_distributed("cuda:1") == (1, 2)
    assert calls == [{"backend": "nccl", "device_id": torch.device("cuda", 1)}]


def test_a_cpu_rank_joins_gloo_unbound(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _joined(monkeypatch, rank=0, world=2)
    assert init_distributed("cpu") == (0, 2)
    assert calls == [{"backend": "gloo", "device_id": None}]


def test_one_rank_joins_no_group(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _joined(monkeypatch, rank=0, world=1)
    assert init_distributed("cuda:0") == (0, 1)
    assert calls == []
