"""`grpo-stream run SERVICE`: start one service process that joins a hub.

The hub (grouper) reads the run config; every other service needs only `--hub` and gets the
config from the hub's Welcome.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import typer

from grpo_stream.cli.common import fail

SERVICES = ("grouper", "generator", "scorer", "trainer")


def run(
    service: str = typer.Argument(..., help="grouper (the hub), generator, scorer or trainer."),
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
    client_name: str = typer.Option(
        "client", "--client-name", help="Which key pair in --keys-dir this service uses."
    ),
) -> None:
    """Run one service until it is told to stop."""
    from grpo_stream.config import ConfigError, load_config
    from grpo_stream.logs import setup_logging
    from grpo_stream.transport.settings import SecuritySettings, TransportSettings

    if service not in SERVICES:
        fail(f"unknown service {service!r}: choose one of {', '.join(SERVICES)}")
    name = instance or f"{service}-{socket.gethostname()}-{os.getpid()}"
    if service == "grouper":
        if keys_dir is not None:
            overrides = [
                *overrides,
                "security.curve=true",
                f"security.keys_dir={json.dumps(str(keys_dir))}",
            ]
        try:
            cfg = load_config(config, overrides)
        except ConfigError as exc:
            fail(str(exc))
        log = setup_logging("grouper", name, cfg.run.run_dir, log_level, console_json=log_json)
        log.info("config.resolved", config=cfg.model_dump(mode="json"))
        from grpo_stream.services.grouper import run_grouper

        raise typer.Exit(run_grouper(cfg, resume=resume))
    if hub is None:
        fail(f"`grpo-stream run {service}` needs --hub tcp://HOST:PORT")
    if config is not None or overrides:
        fail(f"{service} takes its config from the hub: give --config/--set to the grouper")
    security = SecuritySettings(
        curve=keys_dir is not None, keys_dir=keys_dir, client_name=client_name
    )
    transport = TransportSettings()
    setup_logging(service, name, None, log_level, console_json=log_json)
    _run_client(service, hub, name, transport, security, resume, log_level, log_json)


def _run_client(
    service: str,
    hub: str,
    name: str,
    transport: object,
    security: object,
    resume: bool,
    log_level: str,
    log_json: bool,
) -> None:
    from grpo_stream.transport.sockets import HandshakeTimeout

    try:
        if service == "generator":
            from grpo_stream.services.generator import run_generator as entry
        elif service == "scorer":
            from grpo_stream.services.scorer import run_scorer as entry
        else:
            from grpo_stream.services.trainer import run_trainer

            raise typer.Exit(
                run_trainer(
                    hub,
                    name,
                    transport,
                    security,
                    resume=resume,  # type: ignore[arg-type]
                    log_setup=(log_level, log_json),
                )
            )
        raise typer.Exit(entry(hub, name, transport, security, log_setup=(log_level, log_json)))  # type: ignore[arg-type]
    except HandshakeTimeout as exc:
        fail(str(exc))
