"""`grpo-stream plan`: which devices run the trainer and which generate, with shares.

Imports the hardware package and rich inside the command so `grpo-stream --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from grpo_stream.cli.common import fail
from grpo_stream.cli.fingerprint import logs_to_stderr

if TYPE_CHECKING:
    from grpo_stream.config.cluster import ClusterFile
    from grpo_stream.hardware.plan import Assignment, Plan


def _num(value: float | None, unit: str, digits: int = 0) -> str:
    return "unknown" if value is None else f"{value:,.{digits}f}{unit}"


def _row(role: str, a: Assignment) -> list[str]:
    extra = f"{a.share:.1%} / {a.credits}" if role == "generator" else a.reason
    return [
        role,
        a.device_id,
        a.name,
        _num(a.memory_gib, " GiB"),
        _num(a.tflops, " TF"),
        _num(a.bandwidth_gbps, " GB/s"),
        f"{a.score:.2f}",
        extra,
    ]


def _print_plan(plan: Plan) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (
        f"{plan.model_params:,} params: trainer needs {plan.trainer_memory_bytes / 2**30:.1f} GiB"
    )
    table = Table(title=title)
    for column in (
        "role",
        "device",
        "name",
        "memory",
        "compute",
        "bandwidth",
        "score",
        "share / credits",
    ):
        table.add_column(column)
    for a in plan.trainer:
        table.add_row(*_row("trainer", a))
    for a in plan.generators:
        table.add_row(*_row("generator", a))
    for a in plan.idle:
        table.add_row(*_row("idle", a))
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 140))  # piped: do not wrap at 80 columns
    console.print(table)
    if plan.colocated:
        console.print("colocated: the trainer devices also generate")
    console.print(plan.rule)


def plan(
    cluster: Annotated[Path, typer.Option("--cluster", help="Cluster TOML file.")],
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    model_params: str = typer.Option(None, "--model-params", help="Override model_params (7B)."),
    trainer_devices: int = typer.Option(
        None, "--trainer-devices", help="Override trainer_devices."
    ),
) -> None:
    """Print the role plan for a cluster file."""
    from grpo_stream.config.cluster import ClusterError, parse_params
    from grpo_stream.hardware.cluster import load_cluster
    from grpo_stream.hardware.plan import PlanError, plan_roles

    logs_to_stderr()
    try:
        resolved = load_cluster(cluster)
        spec = resolved.spec
        params = spec.model_params if model_params is None else parse_params(model_params)
        if params is None:
            raise ClusterError(f"{cluster}: model_params is not set: add it or pass --model-params")
        result = plan_roles(
            resolved.devices,
            params,
            trainer_devices or spec.trainer_devices,
            latency_s=resolved.latency_s,
            settings=spec.hardware,
            base_credits=spec.base_credits,
        )
    except (ClusterError, PlanError, ValueError) as exc:
        fail(str(exc))
    if json_out:
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    _print_plan(result)
    _print_services(params, trainer_devices or spec.trainer_devices, spec)


def _print_services(params: int, ranks: int, spec: ClusterFile) -> None:
    """What `up --cluster FILE --dry-run` would start under this plan (the same lines)."""
    from grpo_stream.config import ConfigError, load_config
    from grpo_stream.config.cluster import ClusterError
    from grpo_stream.launch import placed
    from grpo_stream.launch.devices import placement_for_run
    from grpo_stream.launch.placement import PlacementError

    try:
        spec.check_launch()
    except ValueError as exc:
        typer.echo(f"services: not placed ({exc})")
        return
    hosts = spec
    sets = [f"hardware.{k}={json.dumps(v)}" for k, v in spec.hardware.model_dump().items()]
    sets += ['run.placement="plan"', f"model.params={params}", f"trainer.ranks={ranks}"]
    try:
        cfg = load_config(None, sets)
        placement, _ = placement_for_run(cfg, hosts, False, save=False, environ={})
        cfg = load_config(None, sets + placed.cluster_overrides(hosts, placement))
        hub = placed.hub_spec(cfg, placement, hosts)
        lines = placed.dry_run(cfg, placement, hub, False, hosts)
    except (ConfigError, ClusterError, PlacementError) as exc:
        fail(str(exc))
    typer.echo("\n".join(lines))
