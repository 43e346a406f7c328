"""Property tests: decode(encode(m)) == m for every message kind and many field values."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from grpo_stream.protocols import (
    MESSAGES,
    Heartbeat,
    Message,
    PromptBatch,
    WeightsChunk,
    decode,
    encode,
)
from grpo_stream.protocols.arrays import wire_dtypes
from grpo_stream.protocols.messages import SamplingParams
from grpo_stream.protocols.schema import FieldSpec, Struct, schema

torch.set_num_threads(1)

NUMPY_DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "uint64", "float16"]
NUMPY_DTYPES += ["float32", "float64", "bfloat16"]
INT64 = st.integers(-(2**63), 2**63 - 1)
FLOATS = st.floats(allow_nan=False)

_native = st.recursive(
    st.none() | st.booleans() | INT64 | FLOATS | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
NATIVE_MAPS = st.dictionaries(st.text(max_size=8), _native, max_size=4)


@st.composite
def numpy_arrays(draw: st.DrawFn) -> np.ndarray[Any, Any]:
    dtype = wire_dtypes()[draw(st.sampled_from(NUMPY_DTYPES))]
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    if dtype.name == "bfloat16":
        base = draw(hnp.arrays(np.float32, shape, elements=st.floats(-1e6, 1e6, width=32)))
        arr = base.astype(dtype)
    else:
        arr = draw(hnp.arrays(dtype, shape))
    layout = draw(st.sampled_from(["c", "transposed", "strided", "big_endian"]))
    if layout == "transposed":
        arr = arr.T
    elif layout == "strided" and arr.ndim > 0:
        arr = np.repeat(arr, 2, axis=0)[::2]
    elif layout == "big_endian" and dtype.kind in "iuf":
        arr = arr.astype(dtype.newbyteorder(">"))
    return arr


@st.composite
def torch_tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float32, torch.int64, torch.bool]))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=4))
    base = draw(hnp.arrays(np.float32, shape, elements=st.floats(-100, 100, width=32)))
    tensor = torch.from_numpy(base).to(dtype)
    return tensor.t() if draw(st.booleans()) else tensor  # .t(): non-contiguous


ARRAYS = numpy_arrays() | torch_tensors()

_BY_KIND: dict[str, st.SearchStrategy[Any]] = {
    "int": INT64,
    "float": FLOATS,
    "str": st.text(max_size=20),
    "bool": st.booleans(),
    "list_str": st.lists(st.text(max_size=8), max_size=4),
    "list_int": st.lists(INT64, max_size=4),
    "list_float": st.lists(FLOATS, max_size=4),
    "list_bool": st.lists(st.booleans(), max_size=4),
    "dict": NATIVE_MAPS,
    "list_dict": st.lists(NATIVE_MAPS, max_size=3),
    "array": ARRAYS,
    "list_array": st.lists(ARRAYS, max_size=3),
}


def field_values(spec: FieldSpec) -> st.SearchStrategy[Any]:
    values = records(spec.struct) if spec.struct is not None else _BY_KIND[spec.kind]
    return st.none() | values if spec.optional else values


def records(cls: type[Message] | type[Struct]) -> st.SearchStrategy[Any]:
    return st.builds(cls, **{spec.name: field_values(spec) for spec in schema(cls)})


def messages(cls: type[Message]) -> st.SearchStrategy[Message]:
    return records(cls)


@pytest.mark.parametrize("kind", sorted(MESSAGES))
def test_every_kind_round_trips(kind: str) -> None:
    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(messages(MESSAGES[kind]))
    def check(msg: Message) -> None:
        back = decode(encode(msg))
        assert back == msg
        for spec in schema(type(msg)):
            if spec.kind == "array":
                assert isinstance(getattr(back, spec.name), np.ndarray)

    check()


@given(numpy_arrays())
@settings(max_examples=60, deadline=None)
def test_array_values_and_shapes_survive(arr: np.ndarray[Any, Any]) -> None:
    back = decode(encode(WeightsChunk(1, 0, 1, ["x"], [arr])))
    assert isinstance(back, WeightsChunk)
    out = back.tensors[0]
    assert out.shape == arr.shape
    assert out.dtype.name == arr.dtype.name
    assert np.array_equal(out.astype(np.float64), arr.astype(np.float64), equal_nan=True)


def test_bf16_tensor_decodes_as_ml_dtypes_bfloat16() -> None:
    tensor = torch.tensor([1.5, -2.25, 3e38], dtype=torch.bfloat16)
    back = decode(encode(WeightsChunk(1, 0, 1, ["x"], [cast(Any, tensor)])))
    assert isinstance(back, WeightsChunk)
    out = back.tensors[0]
    assert out.dtype == wire_dtypes()["bfloat16"]
    assert out.astype(np.float32).tolist() == tensor.float().tolist()


def test_float_field_given_an_int_travels_as_float() -> None:
    sampling = SamplingParams(temperature=cast(Any, 1), top_p=1.0, max_tokens=8)
    back = decode(encode(PromptBatch(1, np.zeros(0, np.int64), [], [], 2, sampling, 0)))
    assert isinstance(back, PromptBatch)
    assert type(back.sampling.temperature) is float  # inside a struct too
    assert back.sampling.temperature == 1.0


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_deeply_nested_dict_field_round_trips() -> None:
    msg = Heartbeat("g", {"deep": _nested(900)})  # near msgpack's own nesting limit
    assert decode(encode(msg)) == msg
