"""`grpo-stream keys`: CURVE key pairs for authenticated, encrypted links."""

from __future__ import annotations

from pathlib import Path

import typer

from grpo_stream.cli.common import not_built

app = typer.Typer(help="CURVE keys for security.curve = true.", no_args_is_help=True)


@app.command("init")
def init(directory: Path = typer.Argument(..., help="Directory to write the keys to.")) -> None:
    """Write server and client key pairs and the allow-list."""
    not_built("keys init")
