"""`grpo-stream dashboard`: serve the read-only web page of a run, live or finished."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from grpo_stream.cli.common import fail
from grpo_stream.dashboard import INSTALL, TOKEN_FILE, URL_FILE, missing_extra

if TYPE_CHECKING:
    from grpo_stream.config.dashboard import DashboardSettings
    from grpo_stream.config.transport import SecuritySettings


def dashboard(
    run_dir: Path = typer.Argument(None, help="The run directory (a live or a finished run)."),
    hub: str = typer.Option(
        None, "--hub", help="A hub's address (tcp://HOST:PORT), without a run directory."
    ),
    host: str = typer.Option(None, "--host", help="Bind host (dashboard.host)."),
    port: int = typer.Option(None, "--port", help="Bind port, 0 for any (dashboard.port)."),
    token_file: Path = typer.Option(
        None, "--token-file", help="Token required beyond loopback (dashboard.token_file)."
    ),
    poll_s: float = typer.Option(
        None, "--poll", help="Seconds between polls while a page is open (dashboard.poll_s)."
    ),
    keys_dir: Path = typer.Option(
        None, "--keys-dir", help="CURVE keys directory for the hub (security.curve)."
    ),
    url_file: Path = typer.Option(
        None, "--url-file", help="Write the page's address here (default RUN_DIR/dashboard.url)."
    ),
) -> None:
    """Serve a web page of a run: the service graph, queues, curves, completions, alarms.

    Reads RUN_DIR (and asks its hub while the run is live), or only the hub given by --hub.
    Nothing is polled while no page is open. Every request needs the dashboard's token (the
    address printed and written to RUN_DIR/dashboard.url carries it), on loopback too."""
    if run_dir is None and hub is None:
        fail("give a run directory, or --hub tcp://HOST:PORT")
    if run_dir is not None and not run_dir.is_dir():
        fail(f"{run_dir} is not a run directory")
    missing = missing_extra()
    if missing:
        fail(f"the dashboard needs {', '.join(missing)}: {INSTALL}")
    settings = _settings(run_dir, host, port, token_file, poll_s)
    token = _token(settings, run_dir)
    security = _security(run_dir, keys_dir)
    _serve(run_dir, hub, settings, token, security, url_file)


def _settings(
    run_dir: Path | None,
    host: str | None,
    port: int | None,
    token_file: Path | None,
    poll_s: float | None,
) -> DashboardSettings:
    """The run's dashboard settings (RUN_DIR/config.toml), with the options over them."""
    # imported here, like every command's settings: `grpo-stream --help` stays instant
    from pydantic import ValidationError

    from grpo_stream.config import ConfigError, load_config
    from grpo_stream.config.dashboard import DashboardSettings

    base = DashboardSettings()
    if run_dir is not None and (run_dir / "config.toml").exists():
        try:
            base = load_config(run_dir / "config.toml").dashboard
        except ConfigError as exc:
            fail(str(exc))
    given = {"host": host, "port": port, "token_file": token_file, "poll_s": poll_s}
    options = {"host": "--host", "port": "--port", "token_file": "--token-file"}
    try:
        return DashboardSettings.model_validate(
            base.model_dump() | {k: v for k, v in given.items() if v is not None}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0])
        fail(f"{options.get(name, '--poll')} (dashboard.{name}): {first['msg']}")


def _token(settings: DashboardSettings, run_dir: Path | None) -> str:
    """The token pages must present, on loopback too (a local user is still a stranger):
    dashboard.token_file, else RUN_DIR/dashboard.token (written when missing), else (a hub
    without a run directory, on loopback) a new one, shown only in the printed address."""
    from grpo_stream.dashboard.server import is_loopback

    path = settings.token_file
    if path is None:
        if run_dir is None and is_loopback(settings.host):
            return secrets.token_urlsafe(24)
        if run_dir is None:
            fail(f"--host {settings.host} is beyond loopback: give --token-file")
        path = run_dir / TOKEN_FILE
        if not path.exists():
            write_token(path)
    try:
        token = path.read_text().strip()
    except OSError as exc:
        fail(f"cannot read the token file {path} (dashboard.token_file): {exc.strerror}")
    if len(token) < 16:
        fail(f"the token in {path} (dashboard.token_file) is shorter than 16 characters")
    return token


def write_token(path: Path) -> None:
    """A new random token, readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(24) + "\n")


def _security(run_dir: Path | None, keys_dir: Path | None) -> SecuritySettings | None:
    """How to reach the hub: --keys-dir, else the run's own security settings (None)."""
    from grpo_stream.config.transport import SecuritySettings

    if keys_dir is not None:
        return SecuritySettings(curve=True, keys_dir=keys_dir)
    return None


def _serve(
    run_dir: Path | None,
    hub: str | None,
    settings: DashboardSettings,
    token: str,
    security: SecuritySettings | None,
    url_file: Path | None,
) -> None:
    from grpo_stream.dashboard.feed import Feed
    from grpo_stream.dashboard.server import bind, create_app, serve, url_of
    from grpo_stream.dashboard.source import RunSource

    try:
        sock, moved = bind(settings.host, settings.port)
    except OSError as exc:
        fail(f"cannot bind {settings.host}:{settings.port} (dashboard.host, .port): {exc}")
    url = url_of(sock, settings.host, token)
    source = RunSource(run_dir, hub, security)
    feed = Feed(source, settings.poll_s)
    app = create_app(feed, settings.host, token)
    where = url_file or (run_dir / URL_FILE if run_dir is not None else None)
    if where is not None:
        _write_private(where, url + "\n")
    if moved:
        typer.echo(f"port {settings.port} is in use: serving on another", err=True)
    typer.echo(f"dashboard at {url}", err=True)
    serve(app, sock, feed)


def _write_private(path: Path, text: str) -> None:
    """Write atomically, mode 0600 (the address may carry the token)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
