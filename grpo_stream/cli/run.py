"""`grpo-stream run SERVICE`: start one service process that joins a hub.

The hub (grouper) reads the run config; every other service needs only what reaches the hub
(`--hub`, `--keys-dir`, `--handshake-timeout`, the run's secret) and gets the config,
transport settings included, from the hub's Welcome (`grpo_stream.session`).

The run's secret comes from `--secret-file` (the grouper: `security.secret_file`), else from
the environment (`GRPO_STREAM_SECRET`: a Kubernetes secretKeyRef, a scheduler's env; `up`
ships it to a service on another host as a file, `grpo_stream.launch.receive`).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from grpo_stream.cli.common import fail
from grpo_stream.transport.exposure import exposure_error

if TYPE_CHECKING:
    from grpo_stream.config import RunConfig
    from grpo_stream.rundir.lock import RunLock
    from grpo_stream.session.service import Join

SERVICES = ("grouper", "generator", "scorer", "trainer", "evaluator", "teacher")
OPTIONAL_SERVICES = ("evaluator", "teacher")
"""Services a run does without: the evaluator only serves eval.every > 0, the teacher only
algo.distill.teacher."""


def run(
    service: str = typer.Argument(
        ..., help="grouper (the hub), generator, scorer, trainer, evaluator or teacher."
    ),
    hub: str = typer.Option(
        None, "--hub", help="The hub's address, e.g. tcp://HOST:PORT (not for grouper)."
    ),
    config: Path = typer.Option(None, "--config", "-c", help="grouper: the run config TOML."),
    overrides: list[str] = typer.Option(
        [], "--set", help="grouper: override a setting, section.key=value."
    ),
    instance: str = typer.Option(
        None, "--instance", help="Instance name (default: SERVICE-HOST-PID)."
    ),
    keys_dir: Path = typer.Option(
        None, "--keys-dir", help="CURVE keys directory: turns security.curve on."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="grouper/trainer: resume from the run's checkpoints."
    ),
    log_json: bool = typer.Option(
        False, "--log-json", help="JSON log lines on stderr (what `up` reads)."
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error."),
    throttle: float = typer.Option(
        1.0,
        "--throttle",
        min=1.0,
        help="generator test hook: run this many times slower and report a slower device.",
    ),
    client_name: str = typer.Option(
        None,
        "--client-name",
        help="Which key pair in --keys-dir this service uses (default: its role's).",
    ),
    secret_file: Path = typer.Option(
        None,
        "--secret-file",
        help="The run's secret (RUN_DIR/secret): signs every Hello (default: "
        "$GRPO_STREAM_SECRET, if set).",
    ),
    weights_noise: float = typer.Option(
        0.0,
        "--fault-weights-noise",
        min=0.0,
        hidden=True,
        help="generator test hook: sample from the weights times (1 + this x N(0, 1)).",
    ),
    handshake_timeout: float = typer.Option(
        None,
        "--handshake-timeout",
        min=0.001,
        help="Not for grouper: seconds to wait for the hub's Welcome "
        "(default: transport.handshake_timeout_s's default, then the hub's).",
    ),
) -> None:
    """Run one service until it is told to stop."""
    from grpo_stream.config.transport import SecuritySettings
    from grpo_stream.logs import setup_logging
    from grpo_stream.session.service import Join

    if service not in SERVICES:
        fail(f"unknown service {service!r}: choose one of {', '.join(SERVICES)}")
    name = instance or f"{service}-{socket.gethostname()}-{os.getpid()}"
    if service == "grouper":
        if handshake_timeout is not None:
            fail("--handshake-timeout is for services that join a hub, not for grouper")
        if keys_dir is not None:
            overrides = [
                *overrides,
                "security.curve=true",
                f"security.keys_dir={json.dumps(str(keys_dir))}",
            ]
        if secret_file is not None:
            overrides = [*overrides, f"security.secret_file={json.dumps(str(secret_file))}"]
        cfg = _grouper_config(config, overrides)
        secret = _secret(cfg.security.secret_file)
        _check_exposure(cfg, secret is not None)
        held = _lock(cfg.run.run_dir)  # noqa: F841 - held until this process exits
        log = setup_logging("grouper", name, cfg.run.run_dir, log_level, console_json=log_json)
        log.info("config.resolved", config=cfg.model_dump(mode="json"))
        from grpo_stream.exits import EXIT_ABORTED
        from grpo_stream.hub.watchdog import StallAbort
        from grpo_stream.services.grouper import run_grouper

        try:
            code = run_grouper(cfg, resume=resume, secret=secret)
        except StallAbort as exc:
            fail(f"stalled: {exc}", code=EXIT_ABORTED)
        raise typer.Exit(code)
    if hub is None:
        fail(f"`grpo-stream run {service}` needs --hub tcp://HOST:PORT")
    if config is not None or overrides:
        fail(f"{service} takes its config from the hub: give --config/--set to the grouper")
    secret = _secret(secret_file)
    if keys_dir is not None and client_name is None:  # `keys init` writes one per role
        from grpo_stream.transport.curve import client_key_name

        client_name = client_key_name(keys_dir, service)
    security = SecuritySettings(
        curve=keys_dir is not None,
        keys_dir=keys_dir,
        client_name=client_name or "client",
        secret_file=secret_file,
    )
    setup_logging(service, name, None, log_level, console_json=log_json)
    join = Join(
        service,
        name,
        hub,
        security,
        handshake_timeout_s=handshake_timeout,
        fingerprint=_fingerprint(service, throttle),
        log_setup=(log_level, log_json),
        secret=secret,
    )
    _run_client(join, resume, throttle, weights_noise)


def _grouper_config(config: Path | None, overrides: list[str]) -> RunConfig:
    """The hub's run config, pre-flight checked (the model may live on other hosts)."""
    from grpo_stream.config import ConfigError, load_config
    from grpo_stream.preflight import PreflightError, check_config_file, preflight

    try:
        check_config_file(config)
        cfg = load_config(config, overrides)
        preflight(cfg, local_model=False)
    except (ConfigError, PreflightError) as exc:
        fail(str(exc))
    return cfg


def _secret(path: Path | None) -> bytes | None:
    """The run's secret (`path`, else $GRPO_STREAM_SECRET, else None); one line before
    anything starts when it cannot be used."""
    from grpo_stream.transport.runsecret import AuthError, resolve_secret

    try:
        return resolve_secret(path, os.environ)
    except AuthError as exc:
        fail(str(exc))


def _check_exposure(cfg: RunConfig, guarded: bool) -> None:
    """One line before the hub starts when it would bind beyond loopback unguarded."""
    refused = exposure_error(cfg.hub.bind, cfg.security, guarded, "hub.bind")
    if refused:
        fail(refused)


def _lock(run_dir: Path) -> RunLock | None:
    from grpo_stream.rundir.lock import RunLocked, acquire

    try:
        return acquire(Path(run_dir), "run grouper")
    except RunLocked as exc:
        fail(str(exc))


def _run_client(join: Join, resume: bool, throttle: float, weights_noise: float) -> None:
    from grpo_stream.session.service import ConfigMismatch
    from grpo_stream.transport.errors import ExposedBind
    from grpo_stream.transport.sockets import HandshakeRefused, HandshakeTimeout

    try:
        if join.service == "generator":
            from grpo_stream.services.generator_main import run_generator

            code = run_generator(join, throttle, weights_noise)
        elif join.service == "scorer":
            from grpo_stream.services.scorer import run_scorer

            code = run_scorer(join)
        elif join.service == "evaluator":
            from grpo_stream.services.evaluator import run_evaluator

            code = run_evaluator(join)
        elif join.service == "teacher":
            from grpo_stream.services.teacher import run_teacher

            code = run_teacher(join)
        else:
            from grpo_stream.services.trainer import run_trainer

            code = run_trainer(join, resume)
    except (HandshakeTimeout, HandshakeRefused, ConfigMismatch, ExposedBind) as exc:
        fail(str(exc))
    raise typer.Exit(code)


def _fingerprint(service: str, throttle: float) -> dict[str, object]:
    """This host's devices for the hub's shares (measured for generators). A throttled test
    generator reports a device `throttle` times slower, as a slower device would be."""
    from grpo_stream.hardware.cpu_cache import default_cache_path
    from grpo_stream.hardware.fingerprint import fingerprint_host
    from grpo_stream.launch.devices import announce

    # measured once per host boot (every generator of a host reports the same device); only
    # the GPUs CUDA_VISIBLE_DEVICES gives this service: the hub scores those
    host = fingerprint_host(benchmark=service == "generator", cache=default_cache_path())
    data = announce(host, dict(os.environ)).to_dict()
    if throttle > 1:
        for device in data.get("devices", []):
            for key in ("fp32_tflops", "tensor_tflops", "memory_bandwidth_gbps"):
                if isinstance(device.get(key), (int, float)):
                    device[key] = device[key] / throttle
        data["throttle"] = throttle
    return data
