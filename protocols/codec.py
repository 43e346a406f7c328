"""Encode messages to ZeroMQ multipart frames and decode them back, validating everything.

Wire format (SPEC.md): frame 0 is a msgpack map `{proto, kind, <fields in declaration
order>}`; each Array field is `{"dtype": name, "shape": [...]}` in the header and one raw
little-endian C-order frame after it (a list[Array] field: a list of those, one frame per
element, in order). Frames follow the header in field order.

Invariants:
- Never pickle; anything that cannot be encoded raises ProtocolError.
- `decode` raises ProtocolError and nothing else, whatever bytes it is given, and checks
  sizes against `Limits` before unpacking or building anything.
- Decoded arrays are numpy views over the received frame buffers (no copy).
- Encoding is deterministic: the same message gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import msgpack
import numpy as np

from grpo_stream.protocols.arrays import as_numpy, wire_dtype, wire_name
from grpo_stream.protocols.errors import ProtocolError
from grpo_stream.protocols.kinds import MESSAGES
from grpo_stream.protocols.schema import FieldSpec, Message, Struct, schema

if TYPE_CHECKING:
    import zmq

PROTO_VERSION = 8
"""The protocol's major version; a peer with another one is refused."""

_MAX_NDIM = 32


@dataclass(frozen=True)
class Limits:
    """Largest message (all frames together) and largest single frame a receiver accepts."""

    max_message_bytes: int = 1 << 30
    max_frame_bytes: int = 1 << 30


DEFAULT_LIMITS = Limits()


# --- encode -----------------------------------------------------------------------------


def _wire_array(value: Any, where: str) -> tuple[dict[str, Any], memoryview]:
    try:
        arr = as_numpy(value)
    except ProtocolError as exc:
        raise ProtocolError("bad_type", f"{where}: {exc.message}") from None
    name = wire_name(arr.dtype)
    if name is None and arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
        name = wire_name(arr.dtype)
    if name is None:
        raise ProtocolError("bad_type", f"{where}: dtype {arr.dtype} cannot travel")
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # not np.ascontiguousarray: it turns 0-d into 1-d
    meta = {"dtype": name, "shape": list(arr.shape)}
    return meta, arr.reshape(-1).view(np.uint8).data


def encode(msg: Message) -> list[bytes | memoryview]:
    """Frames for `socket.send_multipart(frames, copy=False)`: header, then array buffers."""
    kind = type(msg).KIND
    if MESSAGES.get(kind) is not type(msg):
        raise ProtocolError("unknown_kind", f"{type(msg).__name__} is not a registered message")
    try:
        return _encode(msg, kind)
    except ProtocolError as exc:
        exc.kind = kind
        raise


def _encode(msg: Message, kind: str) -> list[bytes | memoryview]:
    header: dict[str, Any] = {"proto": PROTO_VERSION, "kind": kind}
    buffers: list[bytes | memoryview] = []
    for spec in schema(type(msg)):
        value = getattr(msg, spec.name)
        where = f"{kind}.{spec.name}"
        if spec.kind == "array":
            header[spec.name], buf = _wire_array(value, where)
            buffers.append(buf)
        elif spec.kind == "list_array":
            if not isinstance(value, (list, tuple)):
                raise ProtocolError("bad_type", f"{where}: expected a list of arrays")
            metas = []
            for i, item in enumerate(value):
                meta, buf = _wire_array(item, f"{where}[{i}]")
                metas.append(meta)
                buffers.append(buf)
            header[spec.name] = metas
        else:
            header[spec.name] = check_value(spec, value, where, encoding=True)
    try:
        head = msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError("bad_type", f"{kind}: cannot encode header: {exc}") from None
    return [head, *buffers]


# --- field values (both directions) -----------------------------------------------------

_SCALARS: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


def _scalar(kind: str, value: Any, where: str) -> Any:
    expected = _SCALARS[kind]
    if kind == "float" and type(value) is int:
        return float(value)  # floats always travel as float64
    if type(value) is not expected:
        raise ProtocolError("bad_type", f"{where}: expected {kind}, got {type(value).__name__}")
    return value


def _native(value: Any, where: str, encoding: bool) -> None:
    """Raise unless value is msgpack-native: None, bool, int, float, str, bytes, list, dict."""
    pending = [value]  # iterative: a deeply nested value must not hit the recursion limit
    while pending:
        item = pending.pop()
        if item is None or type(item) in (bool, int, float, str, bytes):
            continue
        if type(item) is list or (encoding and type(item) is tuple):
            pending.extend(item)
        elif type(item) is dict:
            for key in item:
                if type(key) is not str:
                    raise ProtocolError(
                        "bad_type", f"{where}: map keys must be str, got {_short(key)}"
                    )
            pending.extend(item.values())
        else:
            raise ProtocolError("bad_type", f"{where}: {type(item).__name__} is not msgpack-native")


def _struct(cls: type[Struct], value: Any, where: str, encoding: bool) -> Any:
    """Encoding: a `cls` instance -> its map (fields in declaration order). Decoding: a map
    with exactly `cls`'s fields -> a `cls` instance. Each field is checked like a message's."""
    specs = schema(cls)
    if encoding:
        if type(value) is not cls:
            got = type(value).__name__
            raise ProtocolError("bad_type", f"{where}: expected {cls.__name__}, got {got}")
        return {
            s.name: check_value(s, getattr(value, s.name), f"{where}.{s.name}", True) for s in specs
        }
    if type(value) is not dict:
        raise ProtocolError("bad_type", f"{where}: expected a {cls.__name__} map")
    names = [s.name for s in specs]
    if value.keys() != set(names):
        extra = sorted(str(k) for k in value if k not in names)
        if extra:
            raise ProtocolError("unknown_field", f"{where}: unknown fields {extra}")
        missing = [n for n in names if n not in value]
        raise ProtocolError("missing_field", f"{where}: missing fields {missing}")
    return cls(**{s.name: check_value(s, value[s.name], f"{where}.{s.name}") for s in specs})


def check_value(spec: FieldSpec, value: Any, where: str, encoding: bool = False) -> Any:
    """The value of a non-array field after type checks (ints widened to float where due)."""
    if value is None and spec.optional:
        return None
    kind = spec.kind
    if kind in _SCALARS:
        return _scalar(kind, value, where)
    if kind == "struct" and spec.struct is not None:
        return _struct(spec.struct, value, where, encoding)
    if kind in ("dict", "list_dict"):
        items = [value] if kind == "dict" else value
        if kind == "list_dict" and not isinstance(value, list):
            raise ProtocolError("bad_type", f"{where}: expected a list of maps")
        for item in items:
            if type(item) is not dict:
                raise ProtocolError("bad_type", f"{where}: expected a map")
            _native(item, where, encoding)
        return value
    if type(value) is not list and not (encoding and type(value) is tuple):
        raise ProtocolError("bad_type", f"{where}: expected {kind}, got {type(value).__name__}")
    elem = kind.removeprefix("list_")
    return [_scalar(elem, item, where) for item in value]


# --- decode -----------------------------------------------------------------------------


def _view(frame: Any) -> memoryview:
    if type(frame) is bytes:
        return memoryview(frame)
    try:
        view = memoryview(getattr(frame, "buffer", frame))  # zmq.Frame: its zero-copy buffer
        if not view.c_contiguous:
            raise ProtocolError("frames", "a frame buffer is not contiguous")
        return view if view.ndim == 1 and view.format == "B" else view.cast("B")
    except (TypeError, ValueError, BufferError):
        raise ProtocolError(
            "frames", f"a frame must be a bytes-like buffer, got {type(frame).__name__}"
        ) from None


def _views(frames: Sequence[Any], limits: Limits) -> list[memoryview]:
    if not frames:
        raise ProtocolError("frames", "empty message: no header frame")
    views, total = [], 0
    for i, frame in enumerate(frames):
        view = _view(frame)
        if view.nbytes > limits.max_frame_bytes:
            raise ProtocolError(
                "too_large", f"frame {i} has {view.nbytes} bytes, limit {limits.max_frame_bytes}"
            )
        total += view.nbytes
        views.append(view)
    if total > limits.max_message_bytes:
        raise ProtocolError(
            "too_large", f"message has {total} bytes, limit {limits.max_message_bytes}"
        )
    return views


def _header(view: memoryview) -> dict[str, Any]:
    n = view.nbytes
    try:
        header = msgpack.unpackb(
            view,
            raw=False,
            strict_map_key=True,
            max_str_len=n,
            max_bin_len=n,
            max_array_len=n,
            max_map_len=n,
            max_ext_len=0,
        )
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        raise ProtocolError("bad_header", f"header is not valid msgpack: {exc}") from None
    if type(header) is not dict:
        raise ProtocolError("bad_header", f"header must be a map, got {type(header).__name__}")
    return header


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _message_class(header: dict[str, Any]) -> type[Message]:
    if "proto" not in header:
        raise ProtocolError("bad_header", "header has no proto")
    proto = header["proto"]
    if type(proto) is not int or proto != PROTO_VERSION:
        raise ProtocolError(
            "version", f"peer speaks protocol {_short(proto)}, we speak {PROTO_VERSION}"
        )
    kind = header.get("kind")
    if not isinstance(kind, str):
        raise ProtocolError("bad_header", f"header kind must be a str, got {_short(kind)}")
    cls: type[Message] | None = MESSAGES.get(kind)
    if cls is None:
        raise ProtocolError("unknown_kind", f"unknown message kind {_short(kind)}", kind[:64])
    return cls


@dataclass(frozen=True)
class _Plan:
    """What decode needs to know about a message class, computed once per class."""

    keys: frozenset[str]  # header keys: proto, kind and every field
    arrays: tuple[FieldSpec, ...]  # array and list_array fields, in frame order
    values: tuple[FieldSpec, ...]  # every other field


_PLANS: dict[str, _Plan] = {}


def _plan(cls: type[Message]) -> _Plan:
    plan = _PLANS.get(cls.KIND)
    if plan is None:
        specs = schema(cls)
        arrays = tuple(s for s in specs if s.kind in ("array", "list_array"))
        values = tuple(s for s in specs if s.kind not in ("array", "list_array"))
        keys = frozenset(s.name for s in specs) | {"proto", "kind"}
        plan = _PLANS[cls.KIND] = _Plan(keys, arrays, values)
    return plan


def _refuse_keys(cls: type[Message], header: dict[str, Any], keys: frozenset[str]) -> NoReturn:
    extra = sorted(str(k) for k in header if k not in keys)
    if extra:
        raise ProtocolError("unknown_field", f"{cls.KIND}: unknown fields {extra}")
    missing = sorted(k for k in keys if k not in header)
    raise ProtocolError("missing_field", f"{cls.KIND}: missing fields {missing}")


def _array_meta(meta: Any, where: str) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    """(dtype, shape, byte length) of a well-formed array entry."""
    if type(meta) is not dict or len(meta) != 2 or "dtype" not in meta or "shape" not in meta:
        raise ProtocolError("bad_array", f"{where}: array entry must be {{dtype, shape}}")
    name, shape = meta["dtype"], meta["shape"]
    dtype = wire_dtype(name) if type(name) is str else None
    if dtype is None:
        raise ProtocolError("bad_array", f"{where}: unsupported dtype {_short(name)}")
    if type(shape) is not list or len(shape) > _MAX_NDIM:
        raise ProtocolError("bad_array", f"{where}: shape must be a list of ints >= 0")
    nbytes = dtype.itemsize
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise ProtocolError("bad_array", f"{where}: shape must be a list of ints >= 0")
        nbytes *= dim
    return dtype, tuple(shape), nbytes


def _array_entries(cls: type[Message], header: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(field, entry, where) for every array frame, in frame order."""
    entries = []
    for spec in _plan(cls).arrays:
        where = f"{cls.KIND}.{spec.name}"
        if spec.kind == "array":
            entries.append((spec.name, header[spec.name], where))
            continue
        metas = header[spec.name]
        if type(metas) is not list:
            raise ProtocolError("bad_array", f"{where}: expected a list of array entries")
        entries += [(spec.name, m, f"{where}[{i}]") for i, m in enumerate(metas)]
    return entries


def _arrays(cls: type[Message], header: dict[str, Any], views: list[memoryview]) -> dict[str, Any]:
    entries = _array_entries(cls, header)
    metas = [_array_meta(entry, where) for _, entry, where in entries]
    if len(entries) != len(views) - 1:
        raise ProtocolError(
            "frames", f"{cls.KIND}: expected {len(entries)} array frames, got {len(views) - 1}"
        )
    out: dict[str, Any] = {s.name: [] for s in _plan(cls).arrays if s.kind == "list_array"}
    for (name, _, where), (dtype, shape, nbytes), view in zip(
        entries, metas, views[1:], strict=True
    ):
        if nbytes != view.nbytes:
            raise ProtocolError(
                "bad_array",
                f"{where}: {dtype.name}{list(shape)} needs {nbytes} bytes, frame has {view.nbytes}",
            )
        arr = np.frombuffer(view, dtype=dtype).reshape(shape)  # a view: no copy
        if name in out:
            out[name].append(arr)
        else:
            out[name] = arr
    return out


def _fields(cls: type[Message], header: dict[str, Any], views: list[memoryview]) -> dict[str, Any]:
    plan = _plan(cls)
    if header.keys() != plan.keys:
        _refuse_keys(cls, header, plan.keys)
    values = _arrays(cls, header, views)
    for spec in plan.values:
        values[spec.name] = check_value(spec, header[spec.name], f"{cls.KIND}.{spec.name}")
    return values


def decode(
    frames: Sequence[bytes | memoryview | zmq.Frame], limits: Limits = DEFAULT_LIMITS
) -> Message:
    """The message in `frames`; raises ProtocolError (and nothing else) for any bad input."""
    views = _views(frames, limits)
    header = _header(views[0])
    cls = _message_class(header)
    try:
        return cls(**_fields(cls, header, views))
    except ProtocolError as exc:
        exc.kind = cls.KIND
        raise
