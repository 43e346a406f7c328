"""Malformed input: every bad message raises ProtocolError with the right code, and only that."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_stream.protocols import (
    DEFAULT_LIMITS,
    PROTO_VERSION,
    Heartbeat,
    Limits,
    Message,
    ProtocolError,
    Rollout,
    Scored,
    WeightsChunk,
    WorkRequest,
    decode,
    encode,
)
from grpo_stream.protocols.make_golden import examples
from grpo_stream.protocols.messages import BatchTotals, SamplingParams, TrainBatch
from grpo_stream.protocols.schema import schema


def _scored() -> Scored:
    return Scored(
        lease_id=1,
        group_id=2,
        rewards=np.array([1.0, 0.0, np.nan], dtype=np.float32),
        component_names=["exact"],
        components=np.ones((1, 3), dtype=np.float32),
        errors=["", "", "timeout"],
    )


def _frames(msg: Any) -> list[bytes]:
    return [bytes(f) for f in encode(msg)]


def _with_header(frames: list[bytes], **changes: Any) -> list[bytes]:
    header = msgpack.unpackb(frames[0])
    for key, value in changes.items():
        if value is _DROP:
            del header[key]
        else:
            header[key] = value
    return [msgpack.packb(header), *frames[1:]]


_DROP = object()


def _code(frames: list[Any], limits: Limits = DEFAULT_LIMITS) -> str:
    with pytest.raises(ProtocolError) as info:
        decode(frames, limits)
    return str(info.value.code)


def test_unknown_kind_is_refused() -> None:
    assert _code(_with_header(_frames(_scored()), kind="telepathy")) == "unknown_kind"


def test_other_major_version_names_both_versions() -> None:
    with pytest.raises(ProtocolError) as info:
        decode(_with_header(_frames(_scored()), proto=PROTO_VERSION - 1))  # the one before
    assert info.value.code == "version"
    assert str(info.value) == f"peer speaks protocol {PROTO_VERSION - 1}, we speak {PROTO_VERSION}"


def test_header_without_proto_is_refused() -> None:
    assert _code(_with_header(_frames(_scored()), proto=_DROP)) == "bad_header"


def test_missing_field_is_refused() -> None:
    frames = _with_header(_frames(_scored()), group_id=_DROP)
    with pytest.raises(ProtocolError) as info:
        decode(frames)
    assert info.value.code == "missing_field"
    assert "group_id" in str(info.value)
    assert info.value.kind == "scored"


def test_field_with_defaults_is_still_required_on_the_wire() -> None:
    assert _code(_with_header(_frames(Heartbeat("g")), stats=_DROP)) == "missing_field"


def test_wrong_type_is_refused() -> None:
    assert _code(_with_header(_frames(_scored()), lease_id="1")) == "bad_type"


def test_bool_is_not_an_int() -> None:
    assert _code(_with_header(_frames(WorkRequest("g", 3)), credits=True)) == "bad_type"


def test_wrong_list_element_type_is_refused() -> None:
    assert _code(_with_header(_frames(_scored()), errors=["", 3, ""])) == "bad_type"


def test_int_map_key_is_refused() -> None:
    head = {"proto": PROTO_VERSION, "kind": "heartbeat", "instance": "g", "stats": {1: 2}}
    raw = msgpack.packb(head)
    assert _code([raw]) == "bad_header"  # msgpack's strict_map_key refuses it while unpacking


def test_bytes_map_key_inside_dict_field_is_refused() -> None:
    frames = _with_header(_frames(Heartbeat("g")), stats={"ok": {b"x": 1}})
    assert _code(frames) == "bad_type"


def test_extra_field_is_refused() -> None:
    assert _code(_with_header(_frames(_scored()), bonus=1)) == "unknown_field"


def test_array_length_disagreeing_with_shape_is_refused() -> None:
    frames = _frames(_scored())
    assert _code([frames[0], frames[1][:-4], frames[2]]) == "bad_array"


def test_array_shape_disagreeing_with_frame_is_refused() -> None:
    frames = _with_header(_frames(_scored()), rewards={"dtype": "float32", "shape": [4]})
    assert _code(frames) == "bad_array"


def test_unknown_dtype_is_refused() -> None:
    frames = _with_header(_frames(_scored()), rewards={"dtype": "float128", "shape": [3]})
    assert _code(frames) == "bad_array"


def test_negative_dimension_is_refused() -> None:
    frames = _with_header(_frames(_scored()), rewards={"dtype": "float32", "shape": [-3]})
    assert _code(frames) == "bad_array"


def test_array_entry_with_extra_keys_is_refused() -> None:
    meta = {"dtype": "float32", "shape": [3], "order": "F"}
    assert _code(_with_header(_frames(_scored()), rewards=meta)) == "bad_array"


def test_message_over_limit_is_refused() -> None:
    frames = _frames(_scored())
    total = sum(len(f) for f in frames)
    assert _code(frames, Limits(max_message_bytes=total - 1)) == "too_large"


def test_frame_over_limit_is_refused() -> None:
    frames = _frames(_scored())
    assert _code(frames, Limits(max_frame_bytes=len(frames[0]) - 1)) == "too_large"


def test_limit_is_checked_before_the_header_is_read() -> None:
    assert _code([b"\xff" * 100], Limits(max_message_bytes=50)) == "too_large"


def test_trailing_frames_are_refused() -> None:
    assert _code([*_frames(_scored()), b"\x00" * 4]) == "frames"


def test_missing_frames_are_refused() -> None:
    assert _code(_frames(_scored())[:-1]) == "frames"


def test_missing_frames_of_a_list_of_arrays_are_refused() -> None:
    msg = WeightsChunk(1, 0, 1, ["a", "b"], [np.zeros(2, np.float32), np.ones(3, np.int8)])
    assert _code(_frames(msg)[:-1]) == "frames"


def test_no_frames_is_refused() -> None:
    assert _code([]) == "frames"


def test_non_buffer_frame_is_refused() -> None:
    assert _code(["not bytes"]) == "frames"


def test_header_that_is_not_a_map_is_refused() -> None:
    assert _code([msgpack.packb([1, "scored"])]) == "bad_header"


def test_header_that_is_not_msgpack_is_refused() -> None:
    assert _code([b"\xc1garbage"]) == "bad_header"


def test_header_with_trailing_bytes_is_refused() -> None:
    frames = _frames(_scored())
    assert _code([frames[0] + b"\x00", *frames[1:]]) == "bad_header"


def test_encode_refuses_a_value_that_is_not_msgpack_native() -> None:
    with pytest.raises(ProtocolError) as info:
        encode(Heartbeat("g", {"seen": {1, 2}}))
    assert info.value.code == "bad_type"


def test_encode_refuses_an_object_array() -> None:
    msg = WeightsChunk(1, 0, 1, ["a"], [np.array(["x"], dtype=object)])
    with pytest.raises(ProtocolError, match="cannot travel"):
        encode(msg)


def test_encode_refuses_a_list_where_an_array_is_due() -> None:
    not_an_array: Any = [1, 2]
    msg = Rollout(1, 2, "g", 0, "p", {}, not_an_array, np.zeros(0, np.int32),
                  np.zeros(1, np.int64), np.zeros(0, np.float32), [], [], 0.1,
                  SamplingParams(1.0, 1.0, 4))  # fmt: skip
    with pytest.raises(ProtocolError) as info:
        encode(msg)
    assert info.value.code == "bad_type"


@given(st.lists(st.binary(max_size=64), max_size=4))
@settings(max_examples=300, deadline=None)
def test_any_bytes_raise_only_protocol_error(frames: list[bytes]) -> None:
    with contextlib.suppress(ProtocolError):  # anything else fails the test
        decode(frames)


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_corrupted_valid_message_decodes_or_raises_protocol_error(data: st.DataObject) -> None:
    frames = _frames(_scored())
    index = data.draw(st.integers(0, len(frames) - 1))
    frame = bytearray(frames[index])
    if frame:
        pos = data.draw(st.integers(0, len(frame) - 1))
        frame[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frame)))
    frames[index] = bytes(frame[:cut])
    with contextlib.suppress(ProtocolError):  # anything else fails the test
        decode(frames)


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4) | st.binary(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)


@given(st.sampled_from(examples()), st.data(), _values)
@settings(max_examples=200, deadline=None)
def test_valid_message_with_one_field_replaced_raises_only_protocol_error(
    msg: Message, data: st.DataObject, value: Any
) -> None:
    frames = _frames(msg)
    names = [s.name for s in schema(type(msg))] + ["proto", "kind"]
    field = data.draw(st.sampled_from(names))
    try:
        changed = _with_header(frames, **{field: value})
    except (OverflowError, ValueError):
        return  # an int msgpack cannot hold: nothing to send
    with contextlib.suppress(ProtocolError):
        decode(changed)


def test_encode_refuses_a_value_nested_deeper_than_msgpack_allows() -> None:
    value: Any = 1
    for _ in range(5000):
        value = [value]
    with pytest.raises(ProtocolError) as info:
        encode(Heartbeat("g", {"deep": value}))
    assert info.value.code == "bad_type"
    assert info.value.kind == "heartbeat"


# ----- struct fields -------------------------------------------------------------------------
def _train_batch_frames() -> list[bytes]:
    (batch,) = [m for m in examples() if isinstance(m, TrainBatch)]
    return _frames(batch)


def _totals_header(**totals: Any) -> list[bytes]:
    return _with_header(_train_batch_frames(), totals=totals)


def test_a_struct_missing_a_field_is_refused() -> None:
    assert _code(_totals_header(num_seqs=2)) == "missing_field"


def test_a_struct_with_an_unknown_field_is_refused() -> None:
    assert _code(_totals_header(num_seqs=2, num_tokens=5, extra=1)) == "unknown_field"


def test_a_struct_field_of_the_wrong_type_is_refused() -> None:
    assert _code(_totals_header(num_seqs=2, num_tokens="5")) == "bad_type"


def test_a_struct_that_is_not_a_map_is_refused() -> None:
    assert _code(_with_header(_train_batch_frames(), totals=[2, 5])) == "bad_type"


def test_a_required_struct_cannot_be_nil() -> None:
    assert _code(_with_header(_train_batch_frames(), totals=None)) == "bad_type"


def test_a_struct_decodes_as_its_typed_record() -> None:
    back = decode(_train_batch_frames())
    assert isinstance(back, TrainBatch)
    assert back.totals == BatchTotals(num_seqs=2, num_tokens=4)  # the golden: 4 of 5 in the loss


def test_encode_refuses_another_record_in_a_struct_field() -> None:
    (batch,) = [m for m in examples() if isinstance(m, TrainBatch)]
    wrong: Any = SamplingParams(1.0, 1.0, 4)
    batch.totals = wrong
    with pytest.raises(ProtocolError) as info:
        encode(batch)
    assert info.value.code == "bad_type" and "BatchTotals" in info.value.message
