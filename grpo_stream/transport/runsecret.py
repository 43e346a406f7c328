"""The run's secret and the keys derived from it, each for one purpose.

The secret is 32 random bytes as 64 hex characters (`write_secret`, mode 0600). A service
gets it from a file (`--secret-file`, `security.secret_file`) or from the environment
(`GRPO_STREAM_SECRET`, how a launcher hands it to a process on another host without a shared
filesystem and without putting it on a command line `ps` shows).

Derived keys (`derive`: HMAC-SHA256 of the purpose with the secret) keep one use from
serving another: a read-only status token (`status` key) cannot sign a Hello or a relay
claim. Relay claims (`relay_claim`, `relay_claim_valid`) live here, beside the weight
server that checks them; Hello, session and status signatures in `grpo_stream.hub.auth`.

Invariant: nothing here logs, prints or returns a secret in an error message.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

SECRET_ENV = "GRPO_STREAM_SECRET"
"""The environment variable a launcher hands the secret in (never a command-line argument)."""
MIN_SECRET_BYTES = 32
STATUS = "status"
RELAY = "relay"
SESSION = "session"


class AuthError(RuntimeError):
    """The secret cannot be used; the message names where it came from and why."""


def write_private(path: Path, text: str) -> Path:
    """`text` at `path`, mode 0600 from its creation (replacing any old file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode under O_CREAT
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return path


def write_secret(path: Path) -> Path:
    """A new random secret at `path` (mode 0600, replacing any old one)."""
    return write_private(path, secrets.token_hex(MIN_SECRET_BYTES) + "\n")


def _checked(key: bytes, where: str) -> bytes:
    if len(key) < MIN_SECRET_BYTES:
        raise AuthError(f"{where}: {len(key)} bytes, at least {MIN_SECRET_BYTES} needed")
    return key


def load_secret(path: Path) -> bytes:
    """The secret in `path`; AuthError if it is unreadable, short, or readable by others."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        key = path.read_bytes().strip()
    except OSError as exc:
        raise AuthError(f"security.secret_file {path}: cannot read it: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AuthError(
            f"security.secret_file {path}: readable by others (mode {stat.S_IMODE(mode):o}); "
            "chmod 600 it"
        )
    return _checked(key, f"security.secret_file {path}")


def resolve_secret(path: Path | None, environ: Mapping[str, str]) -> bytes | None:
    """The run's secret from `path` when given, else from `GRPO_STREAM_SECRET`; None when
    neither is set (the process runs without one)."""
    if path is not None:
        return load_secret(path)
    value = environ.get(SECRET_ENV, "").strip()
    return _checked(value.encode(), SECRET_ENV) if value else None


def derive(secret: bytes, purpose: str) -> bytes:
    """The key for `purpose` (status, relay, session, ...) derived from the run's secret."""
    return hmac.new(secret, f"grpo-stream {purpose} v1".encode(), hashlib.sha256).digest()


def _mac(key: bytes, *fields: str) -> str:
    return hmac.new(key, "\n".join(fields).encode(), hashlib.sha256).hexdigest()


def relay_claim(secret: bytes, address: str) -> str:
    """The signature a fetcher sends with `WeightsRequest.relay = address`: only a holder of
    the run's secret can make a relay of an address (a replayed claim names the same one)."""
    return _mac(derive(secret, RELAY), RELAY, address)


def relay_claim_valid(secret: bytes, address: str, claim: str) -> bool:
    return hmac.compare_digest(claim, relay_claim(secret, address))
