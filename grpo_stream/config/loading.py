"""Loading a run config: a TOML file, `section.key=value` overrides, one-line errors."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grpo_stream.config.run import ConfigError, RunConfig


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "config"
    extra = f" ({len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"invalid config: {field}: {first['msg']}{extra}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse `section.key=value`; the value is read as TOML (so 3, 1e-4, true, "x" work)."""
    if "=" not in text:
        raise ConfigError(f"invalid override {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"invalid override {text!r}: empty key")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word is a string
    return path, value


def apply_override(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"invalid override: {'.'.join(path)}: {part} is not a section")
        node = child
    node[path[-1]] = value


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a TOML file (or the defaults), apply overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        except IsADirectoryError as exc:
            raise ConfigError(f"config {path} is a directory: give a TOML file") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"invalid TOML in {path}: {exc}") from exc
    for text in overrides or []:
        keys, value = parse_override(text)
        apply_override(data, keys, value)
    return config_from_dict(data)


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None
