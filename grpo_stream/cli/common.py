"""Helpers shared by commands: one clear error line and a non-zero exit."""

from __future__ import annotations

from typing import NoReturn

import typer


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one line on stderr and exit non-zero."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def not_built(command: str) -> NoReturn:
    fail(f"`grpo-stream {command}` is not built yet", code=3)
