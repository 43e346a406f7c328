"""`grpo-stream status`: a live table of a run's services."""

from __future__ import annotations

import typer

from grpo_stream.cli.common import not_built


def status(
    hub: str = typer.Option(None, "--hub", help="Hub address, e.g. tcp://host:port."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show the services of a running pipeline."""
    not_built("status")
