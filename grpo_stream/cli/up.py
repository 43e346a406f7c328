"""`grpo-stream up`: start every service of a run, tail their logs, stop them cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from grpo_stream.cli.common import fail


def up(
    config: Path = typer.Option(
        None, "--config", "-c", help="Run config TOML (default: the embedded tiny run)."
    ),
    overrides: list[str] = typer.Option([], "--set", help="Override a setting: section.key=value."),
    run_dir: Path = typer.Option(None, "--run-dir", help="Run directory (overrides run.run_dir)."),
    max_steps: int = typer.Option(
        None, "--max-steps", help="Trainer steps (overrides run.max_steps)."
    ),
    sync: bool = typer.Option(False, "--sync", help="On-policy: hub.max_staleness = 0."),
    resume: bool = typer.Option(
        False, "--resume", help="Resume from the run directory's checkpoints."
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Show every event, not only the important ones."
    ),
    cluster: Path = typer.Option(
        None, "--cluster", help="Cluster TOML: which host runs which service, and how."
    ),
) -> None:
    """Run the whole pipeline (default: the tiny model on arith, on this machine)."""
    from grpo_stream.config import ConfigError, load_config
    from grpo_stream.hardware.cluster import ClusterError
    from grpo_stream.launch import cluster as launch
    from grpo_stream.launch.console import RunConsole
    from grpo_stream.launch.up import LaunchError, Up

    hosts = None
    if cluster is not None:
        try:
            hosts = launch.read_launch_file(cluster)
        except ClusterError as exc:
            fail(str(exc))
    # the cluster's binds first: an explicit --set still wins
    extra = (launch.config_overrides(hosts) if hosts else []) + list(overrides)
    if run_dir is not None:
        extra.append(f"run.run_dir={json.dumps(str(run_dir))}")
    if max_steps is not None:
        extra.append(f"run.max_steps={max_steps}")
    if sync:
        extra.append("hub.max_staleness=0")
    try:
        cfg = load_config(config, extra)
        if hosts is None:  # on a cluster the trainer's host checks its own devices
            from grpo_stream.training.device import trainer_preflight

            trainer_preflight(cfg)
    except ConfigError as exc:
        fail(str(exc))
    rd = Path(cfg.run.run_dir)
    if not resume and (rd / "metrics.jsonl").exists():
        fail(f"{rd} already holds a run: pass --resume to continue it or --run-dir for a new one")
    rd.mkdir(parents=True, exist_ok=True)
    resolved = rd / "config.toml"
    resolved.write_text(cfg.to_toml())
    console = RunConsole(level="debug" if verbose else "info", quiet=not verbose)
    try:
        if hosts is None:
            result = Up(cfg, resolved, resume, console).run()
        else:
            up_run = Up(cfg, resolved, resume, console, place_hub=launch.hub_placer(hosts))
            result = up_run.run(lambda hub: launch.cluster_specs(hosts, cfg, hub, resume))
    except LaunchError as exc:
        fail(str(exc), code=1)
    if not result.completed:
        fail(f"stopped after {result.steps} steps (resume with --resume --run-dir {rd})", code=130)
