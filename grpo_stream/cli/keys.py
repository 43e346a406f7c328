"""`grpo-stream keys`: CURVE key pairs for authenticated, encrypted links.

`keys init DIR` writes the server pair, one client pair per role (trainer, generator, scorer,
evaluator: the hub refuses a Hello claiming another role than its key's), a role-less `client`
pair (status only) and the allow-list; `keys add DIR NAME [--role ROLE]` writes and allows one
more client pair (for another host); `keys export DIR ROLE OUT` copies only what one role
needs (for its host); `keys secret FILE` writes the run's shared secret. Failures exit
non-zero with one line. Imports only pyzmq (no torch), so it is instant.
"""

from __future__ import annotations

import os
import tempfile
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
        str | None, typer.Option("--role", help="trainer, generator, scorer, evaluator or teacher.")
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


@app.command("secret")
def secret(
    path: Annotated[Path, typer.Argument(help="File to write the run's secret to.")],
    force: Annotated[bool, typer.Option("--force", help="Replace a secret already there.")] = False,
) -> None:
    """Write a new run secret (32 random bytes as hex, mode 0600) unless PATH has one.

    Give the same file to every service (`--secret-file PATH`, the hub's
    `security.secret_file`) or its content as GRPO_STREAM_SECRET. Safe to run from several
    processes at once: one secret is written and all of them keep it."""
    from grpo_stream.hub.auth import AuthError, load_secret, write_secret

    target = Path(path)
    if target.exists() and not force:
        try:
            load_secret(target)
        except AuthError as exc:
            fail(f"keys secret: {exc}")
        typer.echo(f"kept the secret in {target}")
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        os.close(fd)
        fresh = write_secret(Path(name))
        published = True
        if force:
            fresh.replace(target)
        else:  # publish it whole, and only if no other process did first
            try:
                os.link(fresh, target)
            except FileExistsError:
                published = False
            fresh.unlink()
    except OSError as exc:
        fail(f"keys secret: {target}: {exc.strerror}")
    typer.echo(f"{'wrote' if published else 'kept'} the run's secret in {target}")


@app.command("export")
def export(
    directory: Annotated[Path, typer.Argument(help="Directory written by `keys init`.")],
    role: Annotated[str, typer.Argument(help="hub, trainer, generator, scorer or evaluator.")],
    out: Annotated[Path, typer.Argument(help="Directory to write ROLE's keys to.")],
    serves: Annotated[
        bool, typer.Option("--serves", help="generator: it binds (relay, direct payloads).")
    ] = False,
) -> None:
    """Copy only what ROLE needs to OUT (copy that to the role's host): the hub and the
    trainer get the server pair and the allow-list, the others their own pair and the
    server's public key."""
    from grpo_stream.launch.shipping import role_key_files, unpack
    from grpo_stream.transport.curve import ROLES

    if role not in ("hub", *ROLES):
        fail(f"keys export: unknown role {role!r}: choose hub, {', '.join(ROLES)}")
    source = Path(directory)
    files: dict[str, bytes] = {}
    for name in role_key_files("grouper" if role == "hub" else role, serves):
        paths = sorted((source / name).glob("*.key")) if name == "authorized" else [source / name]
        for item in paths:
            if not item.is_file():
                fail(f"keys export: missing {item} (run `grpo-stream keys init {source}`)")
            files[item.relative_to(source).as_posix()] = item.read_bytes()
    unpack(files, Path(out))
    typer.echo(f"wrote the {role}'s keys ({len(files)} files) to {out}")
