"""`grpo-stream up`: start every service of a run, tail their logs, stop them cleanly."""

from __future__ import annotations

from pathlib import Path

import typer

from grpo_stream.cli.common import not_built


def up(
    config: Path = typer.Option(None, "--config", "-c", help="Run config TOML (default: the embedded tiny run)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a setting: section.key=value."),
    run_dir: Path = typer.Option(None, "--run-dir", help="Run directory (overrides run.run_dir)."),
    max_steps: int = typer.Option(None, "--max-steps", help="Trainer steps (overrides run.max_steps)."),
    sync: bool = typer.Option(False, "--sync", help="On-policy: hub.max_staleness = 0."),
    resume: bool = typer.Option(False, "--resume", help="Resume from the run directory's checkpoints."),
) -> None:
    """Run the whole pipeline (default: the tiny model on arith, on this machine)."""
    not_built("up")
