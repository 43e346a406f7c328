"""`grpo-stream status`: a live table of a run's services, from the hub."""

from __future__ import annotations

import json
import os
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
    hub: str = typer.Option(None, "--hub", help="Hub address, e.g. tcp://host:port."),
    run_dir: Path = typer.Option(
        None, "--run-dir", help="Read the hub address from RUN_DIR/hub.addr."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    watch: float = typer.Option(0.0, "--watch", help="Refresh every this many seconds (0: once)."),
    keys_dir: Path = typer.Option(
        None, "--keys-dir", help="CURVE keys directory (security.curve)."
    ),
    timeout_s: float = typer.Option(5.0, "--timeout", help="Seconds to wait for the hub."),
) -> None:
    """Show the services of a running pipeline: hosts, versions, throughput, credits, counts.

    On a run that is over (its run directory unlocked), the final state from the run
    directory instead: steps, counters, last metrics and how it ended."""
    if hub is None and run_dir is not None and _over(run_dir):
        from grpo_stream.launch.final import final_state, render_final

        state = final_state(run_dir)
        typer.echo(json.dumps(state) if json_out else render_final(state))
        return
    address = _address(hub, run_dir)
    if watch > 0 and not json_out:
        from rich.live import Live

        with Live(_table(_ask(address, keys_dir, timeout_s)), refresh_per_second=4) as live:
            while True:
                time.sleep(watch)
                live.update(_table(_ask(address, keys_dir, timeout_s)))
    snapshot = _ask(address, keys_dir, timeout_s)
    if json_out:
        typer.echo(json.dumps(snapshot))
        return
    from rich.console import Console

    Console().print(_table(snapshot))


def _over(run_dir: Path) -> bool:
    """Nobody holds the run directory: no `up` and no hub of it is alive."""
    from grpo_stream.launch.runlock import is_held

    if not run_dir.is_dir():
        fail(f"{run_dir} is not a run directory")
    return not is_held(run_dir)


def _address(hub: str | None, run_dir: Path | None) -> str:
    if hub:
        return hub
    if run_dir is None:
        fail("give --hub tcp://HOST:PORT or --run-dir RUN_DIR")
    path = run_dir / "hub.addr"
    if not path.exists():
        fail(f"{path} does not exist: is the run's hub started?")
    return path.read_text().strip()


def _ask(address: str, keys_dir: Path | None, timeout_s: float) -> dict[str, Any]:
    from grpo_stream.protocols import messages as m
    from grpo_stream.transport.settings import SecuritySettings, TransportSettings
    from grpo_stream.transport.sockets import Client, close_context, make_context

    ctx = make_context()
    security = SecuritySettings(curve=keys_dir is not None, keys_dir=keys_dir)
    client = Client(ctx, address, TransportSettings(), security, f"status-{os.getpid()}")
    try:
        client.send(m.StatusRequest())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = client.recv(timeout_ms=100)
            if isinstance(msg, m.Status):
                return {
                    "hub": address,
                    "policy_version": msg.policy_version,
                    "counters": dict(msg.counters),
                    "services": list(msg.services),
                }
    finally:
        client.close()
        close_context(ctx)
    fail(f"no answer from the hub at {address} within {timeout_s:.0f}s (--timeout)")


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
