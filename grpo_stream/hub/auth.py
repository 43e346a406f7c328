"""Who may say Hello in which role: the run's shared secret (without CURVE) and, under
CURVE, the role of the key a peer authenticated with (`KeyRoles`).

`up` writes RUN_DIR/secret (32 random bytes as hex, mode 0600) and gives its path to every
service it starts (`--secret-file`; the hub reads `security.secret_file` from the run config).
Each service signs every Hello it sends; a hub with a secret refuses a Hello whose signature
is missing, wrong, outside `MAX_AGE_S` of the hub's clock, or already seen.

What is signed (`signed_bytes`, canonical): a version tag, service, instance, host, pid,
capacity, rank, the endpoints (JSON, sorted keys), the signing time in ms since the epoch and
a 16-byte random nonce. `Hello.auth = "v1:<time_ms>:<nonce hex>:<HMAC-SHA256 hex>"`.

Invariants:
- without the secret, no Hello is accepted by a hub that has one: a stranger can neither
  join in any role nor announce endpoints (compared with `hmac.compare_digest`);
- a captured Hello cannot be replayed: its nonce is remembered for `MAX_AGE_S` and a Hello
  older than that is refused; the memory holds only nonces of valid Hellos, so it is bounded
  by the honest services' Hello rate, not by a stranger's.

Not covered: the device fingerprint (advisory, for shares); a hub restart forgets the nonces
it saw, so a Hello captured less than `MAX_AGE_S` before a restart can be replayed once after
it; the messages after a Hello are bound to its connection, not signed, so anyone who can read
or alter the traffic can act on that connection: on a network you do not trust, use CURVE.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import time
from pathlib import Path

from grpo_stream.protocols import messages as m
from grpo_stream.transport.settings import SecuritySettings

TAG = "v1"
MAX_AGE_S = 300.0
"""How far a Hello's signing time may be from the hub's clock (queued Hellos, clock skew)."""
MIN_SECRET_BYTES = 32


class AuthError(RuntimeError):
    """The secret file cannot be used; the message names it and says why."""


def write_secret(path: Path) -> Path:
    """A new random secret at `path` (mode 0600, replacing any old one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode under O_CREAT
        os.write(fd, (secrets.token_hex(MIN_SECRET_BYTES) + "\n").encode())
    finally:
        os.close(fd)
    return path


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
    if len(key) < MIN_SECRET_BYTES:
        raise AuthError(
            f"security.secret_file {path}: {len(key)} bytes, at least {MIN_SECRET_BYTES} needed"
        )
    return key


def signed_bytes(hello: m.Hello, time_ms: int, nonce: str) -> bytes:
    """The canonical bytes a Hello's HMAC covers."""
    endpoints = json.dumps(hello.endpoints, sort_keys=True, separators=(",", ":"), default=str)
    fields = (
        TAG, hello.service, hello.instance, hello.host, str(hello.pid), str(hello.capacity),
        str(hello.rank), endpoints, str(time_ms), nonce,
    )  # fmt: skip
    return "\n".join(fields).encode()


def _mac(secret: bytes, hello: m.Hello, time_ms: int, nonce: str) -> str:
    return hmac.new(secret, signed_bytes(hello, time_ms, nonce), hashlib.sha256).hexdigest()


def sign(hello: m.Hello, secret: bytes, now: float | None = None) -> m.Hello:
    """`hello` with its `auth` set (a fresh nonce each call)."""
    time_ms = int((time.time() if now is None else now) * 1000)
    nonce = secrets.token_hex(16)
    hello.auth = f"{TAG}:{time_ms}:{nonce}:{_mac(secret, hello, time_ms, nonce)}"
    return hello


class HelloAuth:
    """The hub's check of each Hello against the run's secret."""

    def __init__(self, secret: bytes, max_age_s: float = MAX_AGE_S) -> None:
        self._secret = secret
        self._max_age_s = max_age_s
        self._seen: dict[str, float] = {}  # nonce -> its Hello's signing time (s)
        self._pruned = 0.0  # when nonces past the max age were last forgotten

    def check(self, hello: m.Hello, now: float | None = None) -> str | None:
        """None if `hello` is signed with the secret, fresh and new; else why not."""
        now = time.time() if now is None else now
        parts = hello.auth.split(":")
        if len(parts) != 4 or parts[0] != TAG or not parts[1].isdigit():
            return "Hello carries no valid auth (is --secret-file given to this service?)"
        _, time_ms, nonce, mac = parts
        if not hmac.compare_digest(mac, _mac(self._secret, hello, int(time_ms), nonce)):
            return "Hello's auth does not match the run's secret"
        signed_at = int(time_ms) / 1000
        if abs(now - signed_at) > self._max_age_s:
            off = now - signed_at
            return f"Hello signed {off:.0f} s from the hub's clock (max {self._max_age_s:g})"
        if now - self._pruned >= 1.0:  # once a second, not per Hello (a fleet joins at once);
            self._pruned = now  # a nonce kept a little longer still only refuses a replay
            self._seen = {n: t for n, t in self._seen.items() if now - t <= self._max_age_s}
        if nonce in self._seen:
            return "Hello replayed (its nonce was seen)"
        self._seen[nonce] = signed_at
        return None


def hello_auth(secret_file: Path | None) -> HelloAuth | None:
    """The hub's checker for `security.secret_file` (None: Hellos are not authenticated)."""
    return None if secret_file is None else HelloAuth(load_secret(secret_file))


class KeyRoles:
    """Under CURVE: the role each allowed client key was made for (`keys init`); a Hello must
    claim its key's role. A key without a role may only ask for status. Not enforced for a
    keys directory from before roles (no key has one)."""

    def __init__(self, roles: dict[str, str | None]) -> None:
        self._roles = roles
        self.enforced = any(role is not None for role in roles.values())

    def check(self, service: str, user_id: str | None) -> str | None:
        """None if the key `user_id` (ZAP User-Id: its z85 public key) may be a `service`."""
        if not self.enforced:
            return None
        role = self._roles.get(user_id or "")
        if role is None:
            return f"key {user_id} has no role here: it may only ask for status"
        if role != service:
            return f"a {role} key cannot say Hello as a {service}"
        return None


def key_roles(security: SecuritySettings) -> KeyRoles | None:
    """The hub's role check for `security` (None without CURVE)."""
    if not security.curve or security.keys_dir is None:
        return None
    from grpo_stream.transport.curve import key_roles as read

    return KeyRoles(read(security.keys_dir))
