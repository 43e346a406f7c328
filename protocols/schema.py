"""The wire's type system: which field types a message may have (`FIELD_KINDS`), each
message's and struct's field list as the codec sees it (`schema`), and the two base classes
(`Message`, `Struct`). The message kinds themselves are in protocols/messages.py, the
structs in protocols/structs.py.

Invariants:
- `schema(cls)` is the declaration order of `cls`'s fields (the wire order), each with one
  kind from `FIELD_KINDS` or "struct" (a class registered in `STRUCTS`); any other
  annotation, an optional array, or an array or struct inside a struct is a TypeError when
  the schema is first built.
- Equality of messages compares arrays by dtype, shape and bytes (NaN == NaN bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from grpo_stream.protocols.arrays import Array as Array
from grpo_stream.protocols.arrays import arrays_equal

FieldKind = Literal[
    "int",
    "float",
    "str",
    "bool",
    "list_str",
    "list_int",
    "list_float",
    "list_bool",
    "dict",
    "list_dict",
    "array",
    "list_array",
    "struct",
]

FIELD_KINDS: dict[str, FieldKind] = {
    "int": "int",
    "float": "float",
    "str": "str",
    "bool": "bool",
    "list[str]": "list_str",
    "list[int]": "list_int",
    "list[float]": "list_float",
    "list[bool]": "list_bool",
    "dict[str, Any]": "dict",
    "list[dict[str, Any]]": "list_dict",
    "Array": "array",
    "list[Array]": "list_array",
}
"""Annotation text -> wire kind (a `Struct` class name is kind "struct", see `STRUCTS`). Any
other annotation on a message field is a bug."""


@dataclass(frozen=True)
class FieldSpec:
    """One field of a message (or of a struct) as the codec sees it."""

    name: str
    kind: FieldKind
    optional: bool
    struct: type[Struct] | None = None  # the record class of a "struct" field


@dataclass
class Struct:
    """Base of a typed record nested in a message: a map of its fields, in declaration order,
    on the wire. Its fields are scalars, `X | None` and lists (no arrays, no structs: one
    level of nesting, so decoding depth stays bounded). Registered in `STRUCTS`."""


STRUCTS: dict[str, type[Struct]] = {}
"""Every struct class by its name (the annotation text of a struct field); the module that
defines a struct registers it here (structs.py)."""
_SCHEMAS: dict[str, tuple[FieldSpec, ...]] = {}


def schema(cls: type[Message] | type[Struct]) -> tuple[FieldSpec, ...]:
    """The fields of a message or struct class in declaration order (the wire order); cached."""
    key = f"{cls.__module__}.{cls.__qualname__}"
    cached = _SCHEMAS.get(key)
    if cached is not None:
        return cached
    specs = []
    nested = issubclass(cls, Struct)
    for f in fields(cls):
        text = str(f.type).replace(" ", "")
        optional = text.endswith("|None")
        base = text.removesuffix("|None")
        struct = STRUCTS.get(base)
        matches = [kind for ann, kind in FIELD_KINDS.items() if ann.replace(" ", "") == base]
        if struct is not None:
            matches = ["struct"]
        if not matches:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported wire type {f.type!r}")
        if optional and matches[0] in ("array", "list_array"):
            raise TypeError(f"{cls.__name__}.{f.name}: arrays cannot be optional")
        if nested and matches[0] in ("array", "list_array", "struct"):
            raise TypeError(f"{cls.__name__}.{f.name}: a struct holds no arrays or structs")
        specs.append(FieldSpec(f.name, matches[0], optional, struct))
    _SCHEMAS[key] = tuple(specs)
    return _SCHEMAS[key]


def _same_array(a: Any, b: Any) -> bool:
    return arrays_equal(a, b)


@dataclass(eq=False)
class Message:
    """Base of every wire message."""

    KIND: ClassVar[str] = ""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for spec in schema(type(self)):
            a, b = getattr(self, spec.name), getattr(other, spec.name)
            if spec.kind == "array":
                same = _same_array(a, b)
            elif spec.kind == "list_array":
                same = len(a) == len(b) and all(
                    _same_array(x, y) for x, y in zip(a, b, strict=True)
                )
            else:
                same = bool(a == b)
            if not same:
                return False
        return True
