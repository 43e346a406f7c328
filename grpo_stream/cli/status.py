"""`grpo-stream status`: a live table of a run's services, from the hub."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from grpo_stream.cli.common import fail

COLUMNS = (
    "instance",
    "service",
    "host",
    "device",
    "devices",
    "version",
    "tokens_per_s",
    "credits",
    "joined",
)


def status(
    run_dir: Path = typer.Argument(
        None, help="The run directory (the hub's address is read from RUN_DIR/hub.addr)."
    ),
    hub: str = typer.Option(None, "--hub", help="Hub address, e.g. tcp://host:port."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    watch: float = typer.Option(0.0, "--watch", help="Refresh every this many seconds (0: once)."),
    keys_dir: Path = typer.Option(
        None, "--keys-dir", help="CURVE keys directory (security.curve)."
    ),
    secret_file: Path = typer.Option(
        None, "--secret-file", help="The run's secret (default: RUN_DIR's status.token or secret)."
    ),
    token_file: Path = typer.Option(
        None, "--token-file", help="A read-only status token (RUN_DIR/status.token)."
    ),
    timeout_s: float = typer.Option(5.0, "--timeout", help="Seconds to wait for the hub."),
) -> None:
    """Show the services of a running pipeline: hosts, versions, throughput, credits, counts.

    On a run that is over (its run directory unlocked), the final state from the run
    directory instead: steps, counters, last metrics and how it ended."""
    if hub is None and run_dir is not None and _over(run_dir):
        from grpo_stream.rundir.final import final_state, render_final

        state = final_state(run_dir)
        typer.echo(json.dumps(state) if json_out else render_final(state))
        return
    address = _address(hub, run_dir)
    key = _credential(secret_file, token_file, run_dir)
    if watch > 0 and not json_out:
        from rich.live import Live

        with Live(_table(ask(address, keys_dir, key, timeout_s)), refresh_per_second=4) as live:
            while True:
                time.sleep(watch)
                live.update(_table(ask(address, keys_dir, key, timeout_s)))
    snapshot = ask(address, keys_dir, key, timeout_s)
    if json_out:
        typer.echo(json.dumps(snapshot))
        return
    from rich.console import Console

    Console().print(_table(snapshot))


def _over(run_dir: Path) -> bool:
    """Nobody holds the run directory: no `up` and no hub of it is alive."""
    from grpo_stream.rundir.lock import is_held

    if not run_dir.is_dir():
        fail(f"{run_dir} is not a run directory")
    return not is_held(run_dir)


def _address(hub: str | None, run_dir: Path | None) -> str:
    if hub:
        return hub
    if run_dir is None:
        fail("give a run directory (grpo-stream status RUN_DIR) or --hub tcp://HOST:PORT")
    path = run_dir / "hub.addr"
    if not path.exists():
        fail(f"{path} does not exist: is the run's hub started?")
    return path.read_text().strip()


def _credential(secret: Path | None, token: Path | None, run_dir: Path | None) -> bytes | None:
    from grpo_stream.hub.auth import AuthError, status_credential

    try:
        return status_credential(secret, token, run_dir)
    except AuthError as exc:
        fail(str(exc))


def ask(address: str, keys_dir: Path | None, key: bytes | None, timeout_s: float) -> dict[str, Any]:
    """The hub's status. `key`: the run's status key (`hub.auth.status_credential`), which a
    hub with a secret requires; `keys_dir`: CURVE."""
    from grpo_stream.config.transport import SecuritySettings
    from grpo_stream.session.status import StatusUnavailable, ask_status

    security = SecuritySettings(curve=keys_dir is not None, keys_dir=keys_dir)
    try:
        return ask_status(address, security, timeout_s, key).as_json()
    except StatusUnavailable as exc:
        fail(f"{exc} (--timeout)")


def _table(snapshot: dict[str, Any]) -> Any:
    from rich.table import Table

    counters = snapshot["counters"]
    caption = " ".join(f"{k}={v}" for k, v in counters.items())
    table = Table(
        title=f"hub {snapshot['hub']}  policy v{snapshot['policy_version']}", caption=caption
    )
    for col in COLUMNS:
        table.add_column(col)
    for svc in sorted(
        snapshot["services"], key=lambda s: (s.get("service", ""), s.get("instance", ""))
    ):
        table.add_row(*(str(svc.get(col, "")) for col in COLUMNS))
    return table
