"""A minimal TOML writer for the resolved config (nested tables and scalars)."""

from __future__ import annotations

import json
from typing import Any


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dump_toml(data: dict[str, Any], prefix: str = "") -> str:
    """Minimal TOML writer for the resolved config (nested tables and scalars)."""
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    lines = [f"{k} = {_toml_value(v)}" for k, v in scalars.items()]
    out = "\n".join(lines)
    for name, table in tables.items():
        full = f"{prefix}{name}"
        body = dump_toml(table, prefix=f"{full}.")
        out += f"\n\n[{full}]\n{body}" if body.strip() else f"\n\n[{full}]"
    return out.strip() + "\n"
