"""Who may act in a run: Hellos signed with the run's secret, the session key each accepted
Hello opens, signed status requests, and, under CURVE, the role of each client key.

`up` writes RUN_DIR/secret (32 random bytes as hex, mode 0600; `transport.runsecret`) and
hands it to every service it starts (`--secret-file`, or `GRPO_STREAM_SECRET` on other
hosts). Each service signs every Hello it sends; a hub with a secret refuses a Hello whose
signature is missing, wrong, outside `MAX_AGE_S` of the hub's clock, or already seen.

What a Hello signs (`signed_bytes`, canonical): a version tag, service, instance, host, pid,
capacity, rank, the endpoints (`weights|announce`, or empty), the signing time in ms since
the epoch and a 16-byte random nonce. `Hello.auth = "v1:<time_ms>:<nonce hex>:<HMAC hex>"`.

After the Hello, every message is sealed (`grpo_stream.transport.seal`) with the session key
`session_key(secret, hello)`: HMAC of the Hello's instance and signature with the secret's
session key. Only holders of the secret can compute it, and each Hello's nonce makes it new.

A status request is signed (`sign_status`) with the status key, `derive(secret, "status")`:
the hub and every holder of the secret can compute it; `up` writes it alone to
RUN_DIR/status.token for readers that should see the run but not act in it.

Invariants:
- without the secret, no Hello is accepted by a hub that has one: a stranger can neither
  join in any role nor announce endpoints (compared with `hmac.compare_digest`);
- a captured Hello or status request cannot be replayed: its nonce is remembered for
  `MAX_AGE_S` and one older than that is refused; the memory holds only nonces of valid
  ones, so it is bounded by the honest services' rate, not by a stranger's.

Not covered: the device fingerprint (advisory, for shares); a hub restart forgets the nonces
it saw, so a Hello captured less than `MAX_AGE_S` before a restart can be replayed once after
it (its session key stays unknown to the replayer: it can say nothing after it).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from pathlib import Path

from grpo_stream.config.transport import SecuritySettings
from grpo_stream.protocols import messages as m
from grpo_stream.transport.curve import key_roles as read
from grpo_stream.transport.runsecret import SESSION, STATUS, derive, write_private
from grpo_stream.transport.runsecret import AuthError as AuthError
from grpo_stream.transport.runsecret import load_secret as load_secret
from grpo_stream.transport.runsecret import write_secret as write_secret

TAG = "v1"
MAX_AGE_S = 300.0
"""How far a signing time may be from the hub's clock (queued Hellos, clock skew)."""
STATUS_TOKEN = "status.token"
"""The file in the run directory holding the status key alone (read-only access)."""


def _endpoints(endpoints: m.Endpoints | None) -> str:
    return "" if endpoints is None else f"{endpoints.weights}|{endpoints.announce}"


def signed_bytes(hello: m.Hello, time_ms: int, nonce: str) -> bytes:
    """The canonical bytes a Hello's HMAC covers."""
    fields = (
        TAG, hello.service, hello.instance, hello.host, str(hello.pid), str(hello.capacity),
        str(hello.rank), _endpoints(hello.endpoints), str(time_ms), nonce,
    )  # fmt: skip
    return "\n".join(fields).encode()


def _mac(secret: bytes, hello: m.Hello, time_ms: int, nonce: str) -> str:
    return hmac.new(secret, signed_bytes(hello, time_ms, nonce), hashlib.sha256).hexdigest()


def _stamp(now: float | None) -> tuple[int, str]:
    return int((time.time() if now is None else now) * 1000), secrets.token_hex(16)


def sign(hello: m.Hello, secret: bytes, now: float | None = None) -> m.Hello:
    """`hello` with its `auth` set (a fresh nonce each call)."""
    time_ms, nonce = _stamp(now)
    hello.auth = f"{TAG}:{time_ms}:{nonce}:{_mac(secret, hello, time_ms, nonce)}"
    return hello


def session_key(secret: bytes, hello: m.Hello) -> bytes:
    """The key that seals every message after the signed `hello` (both sides compute it)."""
    text = f"{hello.instance}\n{hello.auth}".encode()
    return hmac.new(derive(secret, SESSION), text, hashlib.sha256).digest()


def status_key(secret: bytes) -> bytes:
    """The read-only credential: it signs status requests and nothing else."""
    return derive(secret, STATUS)


def write_status_token(run_dir: Path, secret: bytes) -> Path:
    """RUN_DIR/status.token: the status key as hex, mode 0600."""
    return write_private(Path(run_dir) / STATUS_TOKEN, status_key(secret).hex() + "\n")


def load_status_token(path: Path) -> bytes:
    """The status key in a token file (AuthError: unreadable, readable by others, short)."""
    return bytes.fromhex(load_secret(path).decode())


def status_credential(
    secret_file: Path | None = None, token_file: Path | None = None, run_dir: Path | None = None
) -> bytes | None:
    """The status key a reader signs with: from the secret, else the token file, else the
    run directory's status.token or secret (None: none found, for a hub without a secret)."""
    if secret_file is not None:
        return status_key(load_secret(secret_file))
    if token_file is not None:
        return load_status_token(token_file)
    if run_dir is not None and (Path(run_dir) / STATUS_TOKEN).exists():
        return load_status_token(Path(run_dir) / STATUS_TOKEN)
    if run_dir is not None and (Path(run_dir) / "secret").exists():
        return status_key(load_secret(Path(run_dir) / "secret"))
    return None


def _status_mac(key: bytes, time_ms: int, nonce: str) -> str:
    return hmac.new(key, f"{TAG}\nstatus\n{time_ms}\n{nonce}".encode(), hashlib.sha256).hexdigest()


def sign_status(key: bytes, now: float | None = None) -> m.StatusRequest:
    """A StatusRequest signed with the status key (`status_key`, or a status.token's)."""
    time_ms, nonce = _stamp(now)
    return m.StatusRequest(auth=f"{TAG}:{time_ms}:{nonce}:{_status_mac(key, time_ms, nonce)}")


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
            return f"signed {off:.0f} s from the hub's clock (max {self._max_age_s:g})"
        if now - self._pruned >= 1.0:  # once a second, not per message (a fleet joins at once);
            self._pruned = now  # a nonce kept a little longer still only refuses a replay
            self._seen = {n: t for n, t in self._seen.items() if now - t <= self._max_age_s}
        if nonce in self._seen:
            return "replayed (its nonce was seen)"
        self._seen[nonce] = signed_at
        return None


def _parts(auth: str) -> tuple[int, str, str] | None:
    parts = auth.split(":")
    if len(parts) != 4 or parts[0] != TAG or not parts[1].isdigit():
        return None
    return int(parts[1]), parts[2], parts[3]


class HelloAuth:
    """The hub's check of each Hello and status request against the run's secret."""

    def __init__(self, secret: bytes, max_age_s: float = MAX_AGE_S) -> None:
        self.secret = secret
        self._status = status_key(secret)
        self._hellos = FreshNonces(max_age_s)
        self._requests = FreshNonces(max_age_s)

    def check(self, hello: m.Hello, now: float | None = None) -> str | None:
        """None if `hello` is signed with the secret, fresh and new; else why not."""
        parts = _parts(hello.auth)
        if parts is None:
            return "Hello carries no valid auth (is the run's secret given to this service?)"
        time_ms, nonce, mac = parts
        if not hmac.compare_digest(mac, _mac(self.secret, hello, time_ms, nonce)):
            return "Hello's auth does not match the run's secret"
        stale = self._hellos.check(time_ms, nonce, time.time() if now is None else now)
        return None if stale is None else f"Hello {stale}"

    def check_status(self, request: m.StatusRequest, now: float | None = None) -> str | None:
        """None if `request` is signed with the status key, fresh and new; else why not."""
        parts = _parts(request.auth)
        if parts is None:
            return "status needs the run's secret or its status.token (--run-dir, --token-file)"
        time_ms, nonce, mac = parts
        if not hmac.compare_digest(mac, _status_mac(self._status, time_ms, nonce)):
            return "status request's auth does not match the run's secret"
        stale = self._requests.check(time_ms, nonce, time.time() if now is None else now)
        return None if stale is None else f"status request {stale}"


def hello_auth(secret: bytes | None) -> HelloAuth | None:
    """The hub's checker for the run's secret (None: Hellos are not authenticated)."""
    return None if secret is None else HelloAuth(secret)


class KeyRoles:
    """Under CURVE: the role each allowed client key was made for (`keys init`); a Hello must
    claim its key's role. A key without a role may only ask for status. Not enforced for a
    keys directory from before roles (no key has one)."""

    def __init__(self, roles: dict[str, str | None]) -> None:
        self._roles = roles
        self.enforced = any(role is not None for role in roles.values())

    def role(self, user_id: str | None) -> str | None:
        """The role of the key `user_id` (None: none, or an unknown key)."""
        return self._roles.get(user_id or "")

    def check(self, service: str, user_id: str | None) -> str | None:
        """None if the key `user_id` (ZAP User-Id: its z85 public key) may be a `service`."""
        if not self.enforced:
            return None
        role = self.role(user_id)
        if role is None:
            return f"key {user_id} has no role here: it may only ask for status"
        if role != service:
            return f"a {role} key cannot say Hello as a {service}"
        return None


def key_roles(security: SecuritySettings) -> KeyRoles | None:
    """The hub's role check for `security` (None without CURVE)."""
    if not security.curve or security.keys_dir is None:
        return None
    return KeyRoles(read(security.keys_dir))
