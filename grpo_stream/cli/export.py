"""`grpo-stream export`: a LoRA checkpoint as a PEFT adapter, or merged into its base."""

from __future__ import annotations

from pathlib import Path

import typer

from grpo_stream.cli.common import fail

DTYPES = ("auto", "float32", "bfloat16", "float16")


def export(
    checkpoint: Path = typer.Argument(..., help="A checkpoint (step-N) or a run directory."),
    out: Path = typer.Argument(..., help="Output directory (new or empty)."),
    merge: bool = typer.Option(
        False, "--merge", help="Merge the adapter into its base: a plain Hugging Face model."
    ),
    base: str = typer.Option(
        None, "--base", help="Base model (default: the one adapter_config.json names)."
    ),
    dtype: str = typer.Option(
        "auto", "--dtype", help="Merged weights: auto (the base's), float32, bfloat16, float16."
    ),
) -> None:
    """Export a LoRA checkpoint: its adapter, or (--merge) the merged model."""
    from grpo_stream.models.adapter import AdapterError
    from grpo_stream.training.lora_export import export as run_export

    if dtype not in DTYPES:
        fail(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    try:
        written = run_export(checkpoint, out, merge=merge, base=base, dtype=dtype)  # type: ignore[arg-type]
    except (AdapterError, FileNotFoundError, OSError) as exc:
        fail(str(exc).splitlines()[0])
    typer.echo(str(written))
