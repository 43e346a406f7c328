"""The run's secret and the keys derived from it, each for one purpose.

The secret is 32 random bytes as 64 hex characters (`write_secret`, mode 0600). A service
gets it from a file (`--secret-file`, `security.secret_file`) or from the environment
(`GRPO_STREAM_SECRET`, how a launcher hands it to a process on another host without a shared
filesystem and without putting it on a command line `ps` shows).

Derived keys (`derive`: HMAC-SHA256 of the purpose with the secret) keep one use from
serving another: a read-only status token (`status` key) cannot sign a Hello or a weights
request. Signed weights requests live in `grpo_stream.transport.fetch_auth`; Hello, session
and status signatures in `grpo_stream.hub.auth`; both remember the nonces they saw here
(`FreshNonces`).

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
WEIGHTS = "weights"
SESSION = "session"
MAX_AGE_S = 300.0
"""How far a signing time may be from the receiver's clock (queued requests, clock skew)."""


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


class FreshNonces:
    """Signing times within `max_age_s` of the clock, each nonce once."""

    def __init__(self, max_age_s: float = MAX_AGE_S) -> None:
        self._max_age_s = max_age_s
        self._seen: dict[str, float] = {}  # nonce -> its signing time (s)
        self._pruned = 0.0  # when nonces past the max age were last forgotten

    def check(self, time_ms: int, nonce: str, now: float) -> str | None:
        """None if (time_ms, nonce) is fresh and new (and remember it); else why not. Call
        it only once the signature is valid, so a stranger cannot fill the memory."""
        signed_at = time_ms / 1000
        if abs(now - signed_at) > self._max_age_s:
            off = now - signed_at
            return f"signed {off:.0f} s from the receiver's clock (max {self._max_age_s:g})"
        if now - self._pruned >= 1.0:  # once a second, not per message (a fleet joins at once);
            self._pruned = now  # a nonce kept a little longer still only refuses a replay
            self._seen = {n: t for n, t in self._seen.items() if now - t <= self._max_age_s}
        if nonce in self._seen:
            return "replayed (its nonce was seen)"
        self._seen[nonce] = signed_at
        return None
