"""Loading a run config: a TOML file, `section.key=value` overrides, one-line errors."""

from __future__ import annotations

import difflib
import tomllib
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from grpo_stream.config.run import ConfigError, RunConfig


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "config"
    extra = f" ({len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    hint = ""
    if first["type"] == "extra_forbidden":
        near = nearest_setting(".".join(str(p) for p in first["loc"] if not isinstance(p, int)))
        hint = f" (did you mean {near}?)" if near else ""
    return f"invalid config: {field}: {first['msg']}{hint}{extra}"


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
    return config_from_dict(config_data(path, overrides))


def config_data(path: Path | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """A TOML file's settings (none: the defaults) with the overrides applied, unvalidated."""
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
    return data


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None


def nearest_setting(name: str) -> str | None:
    """The setting of RunConfig a mistyped dotted `name` most likely meant: a close name in
    its own section (a close section name for a top-level name), else the same name in
    another section, else a close name anywhere (difflib's ratio of at least 0.6); None when
    nothing is close."""
    section, _, leaf = name.rpartition(".")
    names = setting_names(RunConfig)
    own = [n.rpartition(".")[2] for n in names if n.rpartition(".")[0] == section]
    if not section:  # a misspelt section, or a setting without its section
        own = list(RunConfig.model_fields)
    near = difflib.get_close_matches(leaf, own, n=1, cutoff=0.6)
    if near:
        return f"{section}.{near[0]}" if section else near[0]
    elsewhere = [n for n in names if n.rpartition(".")[2] == leaf]
    if elsewhere:
        return elsewhere[0]
    leaves = {n.rpartition(".")[2]: n for n in names}
    near = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.6)
    return leaves[near[0]] if near else None


def setting_names(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every setting of `model` by dotted name; a section (a model, optional or in a list)
    contributes its settings, not itself."""
    names: list[str] = []
    for name, field in model.model_fields.items():
        nested = _models_in(field.annotation)
        if nested:
            names += setting_names(nested[0], f"{prefix}{name}.")
        else:
            names.append(f"{prefix}{name}")
    return names


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (`M`, `M | None`, `list[M] | None`, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]
