"""`grpo-stream fingerprint`: this host's devices and their performance score."""

from __future__ import annotations

import typer

from grpo_stream.cli.common import not_built


def fingerprint(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Print this host's devices (NVML GPUs, or the CPU) and their performance score."""
    not_built("fingerprint")
