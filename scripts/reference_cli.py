"""The command-line reference (docs/reference/cli.md), read from the Typer app's click objects.
Run through scripts/gen_reference.py."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from typing import Any

import typer.main
from reference_settings import HEADER, _cell, _one_line, type_name

# ----- CLI -------------------------------------------------------------------------------
# Typer builds click objects (recent Typer vendors click as `typer._click`), so they are read
# by their attributes (commands, params, opts, is_flag), not by isinstance against `click`.


def _commands(group: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    for name, command in group.commands.items():
        path = f"{prefix} {name}"
        yield path, command
        if hasattr(command, "commands"):
            yield from _commands(command, path)


def _is_option(param: Any) -> bool:
    return bool(param.param_type_name == "option")


def _param_type(param: Any) -> str:
    """The value's type (from Typer's annotation where it keeps one, else click's type name),
    its range (min/max), and whether the option may be repeated."""
    if _is_option(param) and param.is_flag:
        return "flag"
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    multiple = bool(getattr(param, "multiple", False))
    if annotation is not None:
        args = typing.get_args(annotation)
        name = type_name(args[0] if multiple and args else annotation)
    else:
        choices = getattr(param.type, "choices", None)
        name = " \\| ".join(str(c) for c in choices) if choices else str(param.type.name)
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    bounds = [f">= {low}" if low is not None else "", f"<= {high}" if high is not None else ""]
    name = ", ".join([name, *(b for b in bounds if b)])
    return name + (", repeatable" if multiple else "")


def _param_default(param: Any) -> str:
    if param.required:
        return "required"
    default = param.default
    if default is None or default == () or default == []:
        return ""
    if _is_option(param) and param.is_flag:
        return "on" if default else "off"
    return f"`{default}`"


def _param_help(param: Any) -> str:
    return _one_line(str(getattr(param, "help", None) or ""))


def _usage(path: str, command: Any) -> str:
    ctx = command.context_class(command, info_name=path)
    pieces = [re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), piece)
              for piece in command.collect_usage_pieces(ctx)]  # fmt: skip
    return " ".join([path, *pieces])


def _anchor(path: str) -> str:
    return path.replace(" ", "-")


def cli_page(app: typer.Typer) -> str:
    root = typer.main.get_command(app)
    if not hasattr(root, "commands"):
        raise TypeError("the grpo-stream app is expected to be a command group")
    out = [
        HEADER.format(what="a command in grpo_stream/cli/"),
        "# Command line",
        "",
        "Every command of `grpo-stream`, generated from the Typer app "
        "(`grpo_stream/cli/main.py`). `grpo-stream COMMAND --help` prints the same.",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    commands = list(_commands(root, "grpo-stream"))
    for path, command in commands:
        summary = _one_line(command.get_short_help_str(limit=200))
        out.append(f"| [`{path}`](#{_anchor(path)}) | {_cell(summary)} |")
    out.append("")
    for path, command in commands:
        out += [f"## `{path}` {{#{_anchor(path)}}}", "", _one_line(command.help or ""), ""]
        if hasattr(command, "commands"):
            out += ["Subcommands: " + ", ".join(f"`{n}`" for n in command.commands), ""]
            continue
        out += ["```", _usage(path, command), "```", ""]
        params = [p for p in command.params if p.name != "help"]
        if not params:
            continue
        out += ["| argument or option | type | default | what it does |"]
        out += ["| --- | --- | --- | --- |"]
        for p in params:
            if _is_option(p):
                names = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
            else:
                names = f"`{str(p.name).upper()}`"
            out.append(
                f"| {names} | {_param_type(p)} | {_param_default(p)} | {_cell(_param_help(p))} |"
            )
        out.append("")
    return "\n".join(out).rstrip() + "\n"
