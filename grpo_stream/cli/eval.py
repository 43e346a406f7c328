"""`grpo-stream eval`: pass@1, pass@K and mean reward of a model on a task.

Options default to the run config (`--config`, `--set`), itself defaulting to the tiny model
on arith; torch and transformers are imported only when the command runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from grpo_stream.cli.common import fail


def _progress_bar() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def _print_table(result: Any) -> None:
    rows = [
        ("model", result.model),
        ("task", f"{result.task} ({result.problems} problems x {result.samples} samples)"),
        ("pass@1", f"{result.pass_at_1:.4f}"),
        (f"pass@{result.samples}", f"{result.pass_at_k:.4f}"),
        ("mean reward", f"{result.mean_reward:.4f}"),
        *((f"  {name}", f"{mean:.4f}") for name, mean in result.reward_means.items()),
        ("truncated", str(result.truncated)),
        ("reward errors", str(result.reward_errors)),
    ]
    width = max(len(label) for label, _ in rows) + 2
    for label, value in rows:
        typer.echo(f"{label:<{width}s}{value}")


def _check_model(option: str | None, configured: str) -> None:
    """The model exists (a directory, the HF cache, or the hub) before anything loads."""
    from grpo_stream.preflight import PreflightError, find_model

    try:
        find_model(option or configured, setting="--model" if option else "model.name_or_path")
    except PreflightError as exc:
        fail(str(exc))


def _run(model: str, cfg: Any, **options: Any) -> Any:
    """Run the evaluation under a progress bar; failures become one error line."""
    from transformers.utils import logging as transformers_logging

    from grpo_stream.evaluation import evaluate as run_eval

    hf_logging: Any = transformers_logging
    hf_logging.disable_progress_bar()  # ours is the only progress bar
    with _progress_bar() as bar:
        job = bar.add_task("eval", total=options["problems"])
        try:
            return run_eval(
                model,
                cfg.task,
                dtype=cfg.model.dtype,
                progress=lambda done, total: bar.update(job, completed=done),
                **options,
            )
        except (OSError, ValueError) as exc:
            fail(f"eval failed: {exc}".splitlines()[0])


def evaluate(
    model: str = typer.Option(
        None, "--model", help="Model name or path (default: model.name_or_path)."
    ),
    task: str = typer.Option(
        None,
        "--task",
        help="arith, countdown, dataset, math or reasoning_gym:NAME (default: task.name).",
    ),
    samples: int = typer.Option(8, "--samples", min=1, help="K: samples per problem."),
    n: int = typer.Option(64, "--n", min=1, help="Problems (task indices 0..N-1)."),
    max_tokens: int = typer.Option(
        None, "--max-tokens", min=1, help="Default: generator.max_tokens."
    ),
    temperature: float = typer.Option(
        None, "--temperature", help="Default: generator.temperature."
    ),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:1, ..."),
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="Sequences per generate call."),
    config: Path = typer.Option(None, "--config", "-c", help="Run config TOML (task and model)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a setting: section.key=value."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Evaluate a model or checkpoint: pass@1, pass@K, mean reward."""
    from grpo_stream.config import ConfigError, load_config
    from grpo_stream.logs import setup_logging

    if task is not None:
        overrides = [*overrides, f"task.name={json.dumps(task)}"]
    try:
        cfg = load_config(config, overrides)
    except ConfigError as exc:
        fail(str(exc))
    if temperature is not None and temperature <= 0:
        fail("--temperature must be > 0")
    _check_model(model, cfg.model.name_or_path)
    setup_logging("eval", "cli", level="warning")
    result = _run(
        model or cfg.model.name_or_path,
        cfg,
        samples=samples,
        problems=n,
        max_tokens=max_tokens or cfg.generator.max_tokens,
        temperature=temperature or cfg.generator.temperature,
        seed=seed,
        device=device,
        batch_size=batch_size,
    )
    if json_out:
        typer.echo(json.dumps(result.to_dict()))
    else:
        _print_table(result)
