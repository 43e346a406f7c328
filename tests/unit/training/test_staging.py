"""Device -> host staging of published weights (on the CPU: the unpinned path), and the
weight server's snapshot of staged tensors."""

from __future__ import annotations

import torch

from grpo_stream.training.staging import HostStaging
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
