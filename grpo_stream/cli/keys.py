"""`grpo-stream keys`: CURVE key pairs for authenticated, encrypted links.

`keys init DIR` writes the server pair, one client pair per role (trainer, generator, scorer,
evaluator: the hub refuses a Hello claiming another role than its key's), a role-less `client`
pair (status only) and the allow-list; `keys add DIR NAME [--role ROLE]` writes and allows one
more client pair (for another host). Failures exit non-zero with one line. Imports only pyzmq
(no torch), so it is instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from grpo_stream.cli.common import fail

app = typer.Typer(help="CURVE keys for security.curve = true.", no_args_is_help=True)


@app.command("init")
def init(
    directory: Annotated[Path, typer.Argument(help="Directory to write the keys to.")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite keys already there.")] = False,
) -> None:
    """Write server and client key pairs and the allow-list."""
    from grpo_stream.transport.curve import AUTHORIZED, init_keys
    from grpo_stream.transport.errors import KeysError

    try:
        init_keys(directory, force=force)
    except (KeysError, OSError) as exc:
        fail(f"keys init: {exc}")
    typer.echo(f"wrote the server key pair and one client key pair per role to {directory}")
    typer.echo(f"allowed clients: {directory / AUTHORIZED}")
    typer.echo(f"use them with: --set security.curve=true --set security.keys_dir={directory}")


@app.command("add")
def add(
    directory: Annotated[Path, typer.Argument(help="Directory written by `keys init`.")],
    name: Annotated[str, typer.Argument(help="Name of the new client key pair (e.g. a host).")],
    role: Annotated[
        str | None, typer.Option("--role", help="trainer, generator, scorer or evaluator.")
    ] = None,
) -> None:
    """Write one more client key pair and allow it (copy NAME.key* to that client's host)."""
    from grpo_stream.transport.curve import add_client
    from grpo_stream.transport.errors import KeysError

    try:
        allowed = add_client(directory, name, role=role)
    except (KeysError, OSError) as exc:
        fail(f"keys add: {exc}")
    typer.echo(f"wrote {directory / (name + '.key_secret')} and allowed {allowed}")
    typer.echo(f"on that client set: --set security.client_name={name}")
