"""CURVE keys, socket security and the allow-list authenticator.

Layout of a keys directory (written by `grpo-stream keys init DIR`):

    DIR/server.key, DIR/server.key_secret      the key pair of every binding socket
    DIR/<role>.key, DIR/<role>.key_secret      one client pair per role (ROLES), its role in
                                               the key's metadata
    DIR/client.key, DIR/client.key_secret      a client pair without a role (`status`)
    DIR/authorized/<name>.key                  public keys of the clients allowed in

Invariants:
- With security.curve off, nothing here touches a socket (plaintext, for loopback demos).
- With it on, every binding socket is a CURVE server and every connecting socket a CURVE
  client; one ThreadAuthenticator per context (started on first use, stopped by
  `stop_authenticator`) admits only the public keys found in DIR/authorized when it started,
  so a key added later takes effect when the serving process restarts.
- Secret key files are written with mode 0600.
- A hub maps each authenticated client key to the role in its metadata (`key_roles`) and
  refuses a Hello claiming another role (grpo_stream.hub.auth.KeyRoles); a key without a role
  may only ask for status. A keys directory from before roles (no key has one) is not checked.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import structlog
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from grpo_stream.config.transport import SecuritySettings
from grpo_stream.transport.errors import KeysError

log = structlog.get_logger()

SERVER = "server"
DEFAULT_CLIENT = "client"
ROLES = ("trainer", "generator", "scorer", "evaluator", "teacher")
"""The client roles `keys init` writes a key pair for (the hub holds the server pair)."""
AUTHORIZED = "authorized"
ZAP_DOMAIN = "grpo-stream"
"""Our sockets' ZAP domain; the authenticator's allow-list is registered under it."""
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_ROLE_LINE = re.compile(r"^\s+role = ([A-Za-z]+)\s*$", re.MULTILINE)

_lock = threading.Lock()
_authenticators: dict[int, tuple[zmq.Context[zmq.Socket[bytes]], ThreadAuthenticator]] = {}


def _private(directory: Path, name: str) -> None:
    (directory / f"{name}.key_secret").chmod(0o600)


def init_keys(directory: Path, force: bool = False) -> None:
    """Write the server key pair, the default client key pair and its allow-list entry."""
    directory = Path(directory)
    if (directory / f"{SERVER}.key").exists() and not force:
        raise KeysError(f"keys already exist in {directory} (pass --force to overwrite)")
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    (directory / AUTHORIZED).mkdir(exist_ok=True)
    zmq.auth.create_certificates(str(directory), SERVER)
    _private(directory, SERVER)
    add_client(directory, DEFAULT_CLIENT, force=True)
    for role in ROLES:
        add_client(directory, role, force=True, role=role)


def add_client(directory: Path, name: str, force: bool = False, role: str | None = None) -> Path:
    """Write a client key pair `name` (for `role`: None, status only) and allow it; returns
    the public key's allow-list path."""
    directory = Path(directory)
    if not _NAME.match(name) or name == SERVER:
        raise KeysError(
            f"invalid client name {name!r}: use letters, digits, - and _ (not 'server')"
        )
    if role is not None and role not in ROLES:
        raise KeysError(f"invalid role {role!r}: choose one of {', '.join(ROLES)}")
    authorized = directory / AUTHORIZED
    if not authorized.is_dir():
        raise KeysError(f"{directory} has no {AUTHORIZED}/ (run `grpo-stream keys init` first)")
    if (directory / f"{name}.key").exists() and not force:
        raise KeysError(f"client key {name!r} already exists in {directory}")
    meta = None if role is None else {"role": role}
    public, _secret = zmq.auth.create_certificates(str(directory), name, metadata=meta)
    _private(directory, name)
    allowed = authorized / f"{name}.key"
    text = Path(public).read_text()
    if role is not None:  # the hub reads a client's role from its allow-list entry
        text = text.replace("\nmetadata\n", f"\nmetadata\n    role = {role}\n", 1)
    allowed.write_text(text)
    return allowed


def key_roles(directory: Path) -> dict[str, str | None]:
    """The allowed clients' public keys (z85, the ZAP User-Id) -> the role in their metadata
    (None: no role)."""
    roles: dict[str, str | None] = {}
    for path in sorted((Path(directory) / AUTHORIZED).glob("*.key")):
        public, _ = zmq.auth.load_certificate(str(path))
        found = _ROLE_LINE.search(path.read_text())
        roles[public.decode("ascii")] = None if found is None else found.group(1)
    return roles


def client_key_name(directory: Path, service: str) -> str:
    """The key pair a `service` uses by default: its role's, or `client` in a keys directory
    written before roles."""
    return service if (Path(directory) / f"{service}.key_secret").exists() else DEFAULT_CLIENT


def _keys_dir(security: SecuritySettings) -> Path:
    if security.keys_dir is None:  # the settings validator already forbids this
        raise KeysError("security.keys_dir is required when security.curve is true")
    return Path(security.keys_dir)


def load_pair(directory: Path, name: str) -> tuple[bytes, bytes]:
    """(public, secret) of the key pair `name` in `directory`."""
    path = Path(directory) / f"{name}.key_secret"
    if not path.exists():
        raise KeysError(f"missing key {path} (see `grpo-stream keys init` / `keys add`)")
    public, secret = zmq.auth.load_certificate(str(path))
    if secret is None:
        raise KeysError(f"{path} holds no secret key")
    return public, secret


def server_public_key(directory: Path) -> bytes:
    """The server's public key (all a client needs to know about the server)."""
    path = Path(directory) / f"{SERVER}.key"
    if not path.exists():
        raise KeysError(f"missing key {path} (see `grpo-stream keys init`)")
    public, _ = zmq.auth.load_certificate(str(path))
    return public


def secure_server(
    ctx: zmq.Context[zmq.Socket[bytes]], sock: zmq.Socket[bytes], security: SecuritySettings
) -> None:
    """Make a binding socket a CURVE server checked by the context's authenticator.

    Call before bind. No-op when security.curve is off.
    """
    if not security.curve:
        return
    directory = _keys_dir(security)
    public, secret = load_pair(directory, SERVER)
    start_authenticator(ctx, security)
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    sock.curve_server = True
    sock.zap_domain = ZAP_DOMAIN.encode()


def secure_client(sock: zmq.Socket[bytes], security: SecuritySettings) -> None:
    """Give a connecting socket its client key pair and the server's public key.

    Call before connect. No-op when security.curve is off.
    """
    if not security.curve:
        return
    directory = _keys_dir(security)
    public, secret = load_pair(directory, security.client_name)
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    sock.curve_serverkey = server_public_key(directory)


def start_authenticator(ctx: zmq.Context[zmq.Socket[bytes]], security: SecuritySettings) -> None:
    """Start the context's allow-list authenticator once (idempotent, thread-safe)."""
    authorized = _keys_dir(security) / AUTHORIZED
    if not authorized.is_dir():
        raise KeysError(f"missing {authorized} (run `grpo-stream keys init`)")
    with _lock:
        if id(ctx) in _authenticators:
            return
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve(domain=ZAP_DOMAIN, location=str(authorized))
        _authenticators[id(ctx)] = (ctx, auth)
    allowed = len(list(authorized.glob("*.key")))
    log.info("curve.authenticator_started", authorized=str(authorized), allowed=allowed)


def stop_authenticator(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """Stop the context's authenticator if one runs (before terminating the context)."""
    with _lock:
        entry = _authenticators.pop(id(ctx), None)
    if entry is not None:
        entry[1].stop()
