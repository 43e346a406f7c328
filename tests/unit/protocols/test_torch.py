"""torch <-> numpy at the codec boundary: bf16, gradients, read-only buffers."""

from __future__ import annotations

import warnings
from typing import Any, cast

import numpy as np
import torch

from grpo_stream.protocols import Array, WeightsChunk, decode, encode, from_torch, to_torch
from grpo_stream.protocols.arrays import wire_dtypes

torch.set_num_threads(1)


def _through_wire(tensor: torch.Tensor) -> Array:
    msg = WeightsChunk(1, 0, 1, ["t"], [cast(Any, tensor)])  # encode takes tensors as they are
    frames = [bytes(f) for f in encode(msg)]
    back = decode(frames)
    assert isinstance(back, WeightsChunk)
    return back.tensors[0]


def test_bf16_tensor_comes_back_as_the_same_bf16_tensor() -> None:
    tensor = torch.randn(3, 5).to(torch.bfloat16)
    restored = to_torch(_through_wire(tensor))
    assert restored.dtype == torch.bfloat16
    assert torch.equal(restored, tensor)


def test_to_torch_copies_a_read_only_array_without_warning() -> None:
    arr = _through_wire(torch.arange(6, dtype=torch.float32))
    assert not arr.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = to_torch(arr)
    restored += 1  # writable, and the received frame is untouched
    assert arr.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_to_torch_shares_memory_with_a_writable_array() -> None:
    arr = np.arange(4, dtype=np.int64)
    tensor = to_torch(arr)
    tensor[0] = 9
    assert arr[0] == 9


def test_from_torch_views_a_bf16_tensor_without_copy() -> None:
    tensor = torch.ones(4, dtype=torch.bfloat16)
    arr = from_torch(tensor)
    assert arr.dtype == wire_dtypes()["bfloat16"]
    tensor[1] = 2.0
    assert float(arr[1]) == 2.0


def test_tensor_that_requires_grad_is_encoded() -> None:
    weight = torch.ones(2, 2, requires_grad=True)
    assert np.array_equal(_through_wire(weight), np.ones((2, 2), dtype=np.float32))
