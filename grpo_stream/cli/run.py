"""`grpo-stream run SERVICE`: start one service process that joins a hub."""

from __future__ import annotations

import typer

from grpo_stream.cli.common import not_built


def run(
    service: str = typer.Argument(..., help="grouper (the hub), generator, scorer or trainer."),
    hub: str = typer.Option(None, "--hub", help="The hub's address, e.g. tcp://HOST:PORT."),
) -> None:
    """Run one service."""
    not_built("run")
