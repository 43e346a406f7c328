"""`grpo-stream logs`: merge a run's per-service JSON logs in time order."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from grpo_stream.cli.common import fail


def logs(
    run_dir: Path = typer.Argument(..., help="The run directory."),
    service: str = typer.Option(None, "--service", help="Only this service."),
    level: str = typer.Option(None, "--level", help="Minimum level: debug, info, warning, error."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events."),
    json_out: bool = typer.Option(False, "--json", help="Print raw JSON lines."),
) -> None:
    """Print the merged logs of a run."""
    from grpo_stream.logs import LEVELS, follow_logs, format_event, merge_logs

    if not (run_dir / "logs").is_dir():
        fail(f"no logs in {run_dir} (expected {run_dir / 'logs'})")
    if level is not None and level not in LEVELS:
        fail(f"--level must be one of {', '.join(LEVELS)}")
    events = (
        follow_logs(run_dir, service, level)
        if follow
        else iter(merge_logs(run_dir, service, level))
    )
    for event in events:
        typer.echo(json.dumps(event) if json_out else format_event(event))
