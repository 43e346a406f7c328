"""Device -> host staging of published weights: the unpinned path on the CPU, the pinned path
with CUDA replaced at its boundary (pinned buffer, asynchronous copies, events), and the
weight server's snapshot of staged tensors."""

from __future__ import annotations

import pytest
import torch

from grpo_stream.training.staging import CudaCopies, HostStaging
from grpo_stream.transport.weights import snapshot_arrays


def _weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(10, 4, generator=g)
    return [
        ("embed", embed),
        ("bf16", torch.randn(3, 5, generator=g).to(torch.bfloat16)),
        ("transposed", torch.randn(4, 6, generator=g).t()),  # not contiguous
        ("empty", torch.zeros(0, 3)),
        ("mask", torch.tensor([True, False, True])),
        ("lm_head", embed),  # tied to embed
    ]


def test_staged_tensors_equal_the_originals_across_chunks() -> None:
    staging = HostStaging(pin=False, chunk_bytes=32)  # several chunks
    staged = list(staging.stage(_weights()))
    assert [n for n, _ in staged] == [n for n, _ in _weights()]
    for (_, original), (_, copy) in zip(_weights(), staged, strict=True):
        assert copy.dtype == original.dtype and copy.shape == original.shape
        assert torch.equal(copy, original)


def test_tied_tensors_stay_one_staged_tensor() -> None:
    staged = dict(HostStaging(pin=False).stage(_weights()))
    assert staged["embed"].data_ptr() == staged["lm_head"].data_ptr()
    _, aliases = snapshot_arrays(staged.items())
    assert aliases == {"lm_head": "embed"}  # the server still sends it once


def test_the_buffer_is_allocated_once_and_reused() -> None:
    staging = HostStaging(pin=False)
    first = dict(staging.stage(_weights()))["embed"].data_ptr()
    second = dict(staging.stage(_weights()))["embed"].data_ptr()
    assert first == second


class _FakeCuda(CudaCopies):
    """torch.cuda at staging's boundary: every tensor counts as a device tensor, the pinned
    buffer is a plain one, and the log records buffers, events and their synchronisation."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.events = 0

    def pinned(self, nbytes: int) -> torch.Tensor:
        self.log.append(f"pinned {nbytes}")
        return torch.empty(nbytes, dtype=torch.uint8)

    def on_device(self, tensor: torch.Tensor) -> bool:
        return True

    def recorded_event(self) -> object:
        k = self.events
        self.events += 1
        self.log.append(f"record {k}")
        log = self.log

        class Event:
            def synchronize(self) -> None:
                log.append(f"sync {k}")

        return Event()


def _chunked() -> list[tuple[str, torch.Tensor]]:
    """Three 64-byte tensors: one per chunk at chunk_bytes=64."""
    return [(f"w{i}", torch.full((16,), float(i))) for i in range(3)]


def test_pinned_staging_issues_the_next_chunk_before_handing_on_this_one() -> None:
    log: list[str] = []
    staging = HostStaging(pin=True, chunk_bytes=64, cuda=_FakeCuda(log))
    for name, tensor in staging.stage(_chunked()):
        log.append(f"use {name} {tensor[0].item():g}")
    assert log == [
        "pinned 192",
        "record 0", "record 1", "sync 0", "use w0 0",
        "record 2", "sync 1", "use w1 1",
        "sync 2", "use w2 2",
    ]  # fmt: skip


def test_the_pinned_buffer_is_allocated_once_and_reused() -> None:
    log: list[str] = []
    staging = HostStaging(pin=True, chunk_bytes=64, cuda=_FakeCuda(log))
    for _ in range(2):
        staged = dict(staging.stage(_chunked()))
        assert all(torch.equal(staged[n], t) for n, t in _chunked())
    assert [line for line in log if line.startswith("pinned")] == ["pinned 192"]


def test_pinning_needs_an_accelerator_which_this_host_lacks() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU host: pinned memory is available")
    with pytest.raises(RuntimeError, match="pin"):
        CudaCopies().pinned(64)  # why the trainer stages only from a GPU (TrainState.create)
