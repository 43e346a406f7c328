"""Shared by the deploy tests: read `grpo-stream ...` command lines with the real CLI.

Every command line found in deploy/ (Slurm, systemd, Kubernetes) goes through the Typer app's
own click parser, so an option that does not exist, a missing value or an unknown subcommand
fails here exactly as it would on a cluster; `--set` overrides go through `load_config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

from grpo_stream.cli.main import app
from grpo_stream.cli.run import SERVICES
from grpo_stream.config import ConfigError, RunConfig, load_config

try:  # typer >= 0.20 ships its own click, whose errors derive from TyperException
    from typer import TyperException as UsageError
except ImportError:  # older typer runs on click itself
    from click import ClickException as UsageError  # type: ignore[assignment]

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"


@dataclass(frozen=True)
class Command:
    """One parsed `grpo-stream` invocation."""

    argv: tuple[str, ...]
    path: tuple[str, ...]
    """Subcommand names, e.g. ("run",)."""
    params: dict[str, Any]
    """What click parsed, by parameter name (e.g. service, hub, overrides, keys_dir)."""

    @property
    def service(self) -> str:
        assert self.path == ("run",), f"not a `grpo-stream run` command: {self.argv}"
        return str(self.params["service"])

    @property
    def overrides(self) -> list[str]:
        return list(self.params.get("overrides") or [])


class Cli:
    """Parses and checks command lines against `grpo_stream.cli.main.app`."""

    def __init__(self) -> None:
        self.root = typer.main.get_command(app)

    def parse(self, argv: list[str] | tuple[str, ...]) -> Command:
        assert argv and Path(argv[0]).name == "grpo-stream", f"not grpo-stream: {argv}"
        command: Any = self.root
        args = list(argv[1:])
        path: list[str] = []
        while hasattr(command, "list_commands"):  # a group: the next word names a subcommand
            assert args, f"{argv}: no subcommand after {' '.join(path) or 'grpo-stream'}"
            name = args.pop(0)
            sub = command.get_command(typer.Context(command), name)
            assert sub is not None, f"{argv}: no subcommand {name!r}"
            command, path = sub, [*path, name]
        try:
            ctx = command.make_context(" ".join(["grpo-stream", *path]), args)
        except UsageError as exc:
            pytest.fail(f"{' '.join(argv)}: {exc.format_message()}")
        return Command(tuple(argv), tuple(path), dict(ctx.params))

    def parse_run(self, argv: list[str] | tuple[str, ...]) -> Command:
        """Parse a `grpo-stream run SERVICE` line and check that it passes each option only
        to the service that reads it (run.py ignores grouper options on clients and
        --hub/--keys-dir on the grouper, so a misplaced one would be silently lost)."""
        cmd = self.parse(argv)
        assert cmd.service in SERVICES, f"{argv}: unknown service {cmd.service!r}"
        p = cmd.params
        if cmd.service == "grouper":
            assert p["hub"] is None, f"{argv}: the grouper ignores --hub"
        else:
            assert p["hub"], f"{argv}: {cmd.service} needs --hub"
            assert p["config"] is None, f"{argv}: only the grouper reads --config"
            assert not cmd.overrides, f"{argv}: only the grouper reads --set"
            if cmd.service != "trainer":
                assert not p["resume"], f"{argv}: only grouper and trainer resume"
        return cmd

    def hub_config(self, cmd: Command, config: Path | None = None) -> RunConfig:
        """The config a grouper command line resolves (its --config replaced by `config`)."""
        assert cmd.service == "grouper"
        try:
            return load_config(config, cmd.overrides)
        except ConfigError as exc:
            pytest.fail(f"{' '.join(cmd.argv)}: {exc}")

    @staticmethod
    def port_of(address: str) -> int:
        """The port of tcp://HOST:PORT."""
        return int(address.rsplit(":", 1)[1])

    @staticmethod
    def host_of(address: str) -> str:
        """The host of tcp://HOST:PORT."""
        return address.split("://", 1)[1].rsplit(":", 1)[0]


@pytest.fixture(scope="session")
def cli() -> Cli:
    return Cli()


@pytest.fixture(scope="session")
def deploy_dir() -> Path:
    return DEPLOY


@pytest.fixture(scope="session")
def sbatch(deploy_dir: Path) -> Path:
    return deploy_dir / "slurm" / "grpo-stream.sbatch"
