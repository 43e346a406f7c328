"""`grpo-stream eval`: pass@1, pass@K and mean reward of a model on a task."""

from __future__ import annotations

import typer

from grpo_stream.cli.common import not_built


def evaluate(
    model: str = typer.Option("grpo-stream/tiny-arith", "--model", help="Model name or path."),
    task: str = typer.Option("arith", "--task", help="Task name."),
    samples: int = typer.Option(8, "--samples", help="K: samples per problem."),
    n: int = typer.Option(64, "--n", help="Problems."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Evaluate a model or checkpoint: pass@1, pass@K, mean reward."""
    not_built("eval")
