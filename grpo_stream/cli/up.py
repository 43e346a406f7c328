"""`grpo-stream up`: start every service of a run, tail their logs, stop them cleanly."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from grpo_stream.cli.common import fail

if TYPE_CHECKING:
    from grpo_stream.config import RunConfig
    from grpo_stream.config.cluster import ClusterFile
    from grpo_stream.launch.placement import Placement
    from grpo_stream.launch.ray.runner import RayRunner
    from grpo_stream.rundir.lock import RunLock


def up(
    config: Path = typer.Option(
        None, "--config", "-c", help="Run config TOML (default: the embedded tiny run)."
    ),
    overrides: list[str] = typer.Option([], "--set", help="Override a setting: section.key=value."),
    run_dir: Path = typer.Option(None, "--run-dir", help="Run directory (overrides run.run_dir)."),
    max_steps: int = typer.Option(
        None, "--max-steps", help="Trainer steps in all (overrides run.max_steps)."
    ),
    sync: bool = typer.Option(
        False, "--sync", metavar="", help="On-policy: hub.max_staleness = 0 (a flag)."
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        metavar="",
        help="Continue the run in the run directory: its config.toml is the run's; --config "
        "and --set may change only what does not change what is trained (more steps, "
        "logging, eval, services).",
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", metavar="", help="Show every event, not only the important ones."
    ),
    check: bool = typer.Option(
        False, "--check", metavar="", help="Only run the pre-flight checks: exit 0 if all pass."
    ),
    cluster: Path = typer.Option(
        None, "--cluster", help="Cluster TOML: which host runs which service, and how."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print each service's host, devices and command; start nothing."
    ),
    task: str = typer.Option(
        None, "--task", help="A built-in task with its shipped model: arith (default), guess, calc."
    ),
    launcher: str = typer.Option(
        "local",
        "--launcher",
        help="local: processes here (or on --cluster's hosts); ray: one Ray actor per service; "
        "slurm: srun steps on the nodes of the Slurm job it runs in (deploy/slurm).",
    ),
    address: str = typer.Option(
        None, "--address", help="--launcher ray: the Ray head, HOST:PORT (default: a local Ray)."
    ),
) -> None:
    """Run the whole pipeline (default: the tiny model on arith, on this machine)."""
    from grpo_stream.config import ConfigError
    from grpo_stream.config.cluster import ClusterError, read_launch_file
    from grpo_stream.config.resume import load_run_config
    from grpo_stream.launch import cluster as launch
    from grpo_stream.launch.console import RunConsole
    from grpo_stream.launch.up import LaunchError, Up
    from grpo_stream.preflight import PreflightError, check_config_file

    _check_launcher(launcher, address, cluster)
    hosts = None
    placing: list[str] = []  # what the hosts decide of the config; an explicit --set wins
    if cluster is not None:
        try:
            hosts = read_launch_file(cluster)
        except ClusterError as exc:
            fail(str(exc))
    elif launcher == "slurm":
        hosts, placing = _slurm_hosts()
    from grpo_stream.launch import placed
    from grpo_stream.launch.devices import placement_for_run
    from grpo_stream.launch.placement import PlacementError

    # the cluster's binds first: an explicit --set still wins
    extra = list(overrides)
    if task is not None:
        from grpo_stream.envs.presets import task_preset

        try:
            extra = task_preset(task) + extra
        except ValueError as exc:
            fail(str(exc))
    if run_dir is not None:
        extra.append(f"run.run_dir={json.dumps(str(run_dir))}")
    if max_steps is not None:
        extra.append(f"run.max_steps={max_steps}")
    if sync:
        extra.append("hub.max_staleness=0")
    try:
        check_config_file(config)
        binds = launch.config_overrides(hosts) if hosts else []
        cfg, changed = load_run_config(config, binds + placing + extra, resume)
        if hosts is None and launcher == "local":  # elsewhere the trainer's host checks them
            from grpo_stream.training.device import trainer_preflight

            trainer_preflight(cfg)
    except (ConfigError, PreflightError) as exc:
        fail(str(exc))
    local_model = hosts is None and launcher == "local"
    if check:
        _check_only(cfg, resume, local_model=local_model)
    # a dry run takes nothing: no lock, no run directory, no saved placement
    lock = None if dry_run else _take_run_dir(cfg, resume, local_model=local_model)
    rd = Path(cfg.run.run_dir)
    runner: RayRunner | None = None
    notes: list[str] = []
    try:
        if launcher == "ray":
            hosts, placement, runner = _ray_setup(cfg, address)
        else:
            placement, notes = placement_for_run(
                cfg, hosts, resume, save=lock is not None, environ=dict(os.environ)
            )
        if hosts is not None:  # rank 0 where the placement put it, ranks as it counts them
            binds = placing + placed.cluster_overrides(hosts, placement)
            cfg = load_run_config(config, binds + extra, resume)[0]
    except (PlacementError, ClusterError, ConfigError) as exc:
        fail(str(exc))
    _run_secret(cfg, write=lock is not None)
    resolved = rd / "config.toml"
    console = RunConsole(
        level="debug" if verbose else "info", quiet=not verbose, every=cfg.run.console_every
    )
    place_hub = placed.hub_placer(cfg, placement, hosts)
    up_run = Up(cfg, resolved, resume, console, place_hub=place_hub, runner=runner)
    if lock is None:
        typer.echo("\n".join(placed.dry_run(cfg, placement, up_run.hub_spec(), resume, hosts)))
        if runner is not None:
            runner.close()
        return
    resolved.write_text(cfg.to_toml())
    if changed:
        console.note(
            f"resuming {rd} with its config.toml; this command changed {', '.join(changed)}"
        )
    for note in notes:
        console.note(note)
    try:
        result = up_run.run(lambda hub: placed.placed_specs(cfg, placement, hub, resume, hosts))
    except LaunchError as exc:
        fail(str(exc), code=1)
    finally:
        lock.release()
        if runner is not None:
            runner.close()
    if not result.completed:
        fail(
            f"stopped after {result.steps} of {cfg.run.max_steps} steps; to continue: "
            f"grpo-stream up --resume --run-dir {rd}",
            code=130,
        )


LAUNCHERS = ("local", "ray", "slurm")


def _check_launcher(launcher: str, address: str | None, cluster: Path | None) -> None:
    if launcher not in LAUNCHERS:
        fail(f"--launcher {launcher}: choose one of {', '.join(LAUNCHERS)}")
    if launcher == "ray" and cluster is not None:
        fail("--launcher ray takes its nodes from the Ray cluster: drop --cluster")
    if launcher == "slurm" and cluster is not None:
        fail("--launcher slurm takes its nodes from the Slurm job: drop --cluster")
    if address is not None and launcher != "ray":
        fail("--address is the Ray head's address: it needs --launcher ray")


def _ray_setup(cfg: RunConfig, address: str | None) -> tuple[ClusterFile, Placement, RayRunner]:
    """Join (or start) Ray, place the run over its nodes, and the runner for its actors."""
    try:  # Ray is an optional extra, and heavy: imported only for --launcher ray
        from grpo_stream.launch.ray.cluster import RayClusterError, connect, discover
        from grpo_stream.launch.ray.runner import RayRunner
    except ImportError:
        fail("--launcher ray needs Ray: pip install 'grpo-stream[ray]'")
    try:
        connect(address)
        nodes, hosts, placement = discover(cfg)
    except RayClusterError as exc:
        fail(str(exc))
    return hosts, placement, RayRunner(cfg, nodes, placement, started_ray=address is None)


def _slurm_hosts() -> tuple[ClusterFile, list[str]]:
    """The nodes of the Slurm job this runs in, as a cluster file, and the placement its
    layout asks for (grpo_stream.launch.slurm)."""
    from grpo_stream.launch.slurm import (
        SlurmError,
        allocation_cluster,
        layout_from_env,
        placement_override,
    )

    try:
        layout = layout_from_env(os.environ)
    except SlurmError as exc:
        fail(str(exc))
    return allocation_cluster(layout), placement_override(layout)


def _run_secret(cfg: RunConfig, write: bool) -> None:
    """Every Hello of this run is signed: a new RUN_DIR/secret (0600) unless the config names
    its own `security.secret_file`; the hub reads it from the config, the others get
    `--secret-file`."""
    from grpo_stream.hub.auth import load_secret, write_secret, write_status_token

    path = cfg.security.secret_file
    if path is None:
        path = Path(cfg.run.run_dir) / "secret"
        cfg.security = cfg.security.model_copy(update={"secret_file": path})
        if write:
            write_secret(path)
    if write:  # a read-only credential for `status` and the dashboard
        write_status_token(Path(cfg.run.run_dir), load_secret(path))


def _take_run_dir(cfg: RunConfig, resume: bool, local_model: bool) -> RunLock:
    """Pre-flight, then the run directory's lock (held until released or this process ends)."""
    from grpo_stream.launch.prepare import StartError, start_run

    try:
        return start_run(cfg, resume, local_model=local_model)
    except StartError as exc:
        fail(str(exc))


def _check_only(cfg: RunConfig, resume: bool, local_model: bool) -> NoReturn:
    """`up --check`: the pre-flight checks alone, one line each, and what the run directory
    holds (as `up` would judge it); exit 0, or 2 at the first that fails."""
    from grpo_stream.launch.prepare import StartError, check_run_dir_state
    from grpo_stream.preflight import PreflightError, preflight

    try:
        lines = preflight(cfg, local_model=local_model)
        check_run_dir_state(cfg, resume)
    except (PreflightError, StartError) as exc:
        fail(str(exc))
    for line in lines:
        typer.echo(f"ok  {line}")
    raise typer.Exit(0)
