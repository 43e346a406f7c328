"""`grpo-stream plan`: which devices run the trainer and which generate, with shares."""

from __future__ import annotations

from pathlib import Path

import typer

from grpo_stream.cli.common import not_built


def plan(cluster: Path = typer.Option(..., "--cluster", help="Cluster TOML file.")) -> None:
    """Print the role plan for a cluster file."""
    not_built("plan")
