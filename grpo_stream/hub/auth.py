"""Who may act in a run: Hellos signed with the run's secret and the hub's challenge, the
session key each accepted Hello opens, signed status requests, and, under CURVE, the role of
each client key.

`up` writes RUN_DIR/secret (32 random bytes as hex, mode 0600; `transport.runsecret`) and
hands it to every service it starts (`--secret-file`, or `GRPO_STREAM_SECRET` on other
hosts). Each service signs every Hello it sends; a hub with a secret refuses a Hello whose
signature is missing, wrong, outside `MAX_AGE_S` of the hub's clock, or already seen.

The hub's challenge: 16 random bytes (hex) a hub draws when it starts (`HelloAuth`). A Hello
or status request signs the challenge it answers; one that answers another (or none) gets a
`Challenge` with the current one instead of an answer, and its sender signs again. So what
was signed for a hub before it restarted is refused after it, and a session key, which the
signature keys, never outlives the hub that accepted it.

What a Hello signs (`signed_bytes`, canonical): a version tag, service, instance, host, pid,
capacity, rank, the endpoints (`weights|announce`, or empty), the signing time in ms since
the epoch, a 16-byte random nonce and the challenge.
`Hello.auth = "v2:<time_ms>:<nonce hex>:<challenge>:<HMAC hex>"`.

After the Hello, every message is sealed (`grpo_stream.transport.seal`) with the session key
`session_key(secret, hello)`: HMAC of the Hello's instance and signature with the secret's
session key. Only holders of the secret can compute it, and each Hello's nonce makes it new.

A status request is signed (`sign_status`) with the status key, `derive(secret, "status")`,
and the challenge: the hub and every holder of the secret can compute it; `up` writes it
alone to RUN_DIR/status.token for readers that should see the run but not act in it.

Invariants:
- without the secret, no Hello is accepted by a hub that has one: a stranger can neither
  join in any role nor announce endpoints (compared with `hmac.compare_digest`);
- a captured Hello or status request cannot be replayed: to the same hub, its nonce is
  remembered for `MAX_AGE_S` and one older than that is refused; to a restarted hub, it
  answers a challenge that hub never drew. The memory holds only nonces of valid ones, so it
  is bounded by the honest services' rate, not by a stranger's;
- a request that does not answer the current challenge changes nothing (its signature is not
  even checked): the answer is the challenge, which is no secret.

Not covered: the device fingerprint (advisory, for shares).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from grpo_stream.config.transport import SecuritySettings
from grpo_stream.protocols import messages as m
from grpo_stream.transport.curve import key_roles as read
from grpo_stream.transport.runsecret import MAX_AGE_S, SESSION, STATUS, derive, write_private
from grpo_stream.transport.runsecret import AuthError as AuthError
from grpo_stream.transport.runsecret import FreshNonces as FreshNonces
from grpo_stream.transport.runsecret import load_secret as load_secret
from grpo_stream.transport.runsecret import write_secret as write_secret

TAG = "v2"
CHALLENGE_BYTES = 16
STATUS_TOKEN = "status.token"
"""The file in the run directory holding the status key alone (read-only access)."""


def _endpoints(endpoints: m.Endpoints | None) -> str:
    return "" if endpoints is None else f"{endpoints.weights}|{endpoints.announce}"


def new_challenge() -> str:
    """A hub's challenge: random, drawn once per hub process."""
    return secrets.token_hex(CHALLENGE_BYTES)


@dataclass(frozen=True)
class Stamp:
    """What a signature covers besides the message: when, a nonce, the challenge answered."""

    time_ms: int
    nonce: str
    challenge: str

    @classmethod
    def new(cls, challenge: str, now: float | None = None) -> Stamp:
        signed_at = time.time() if now is None else now
        return cls(int(signed_at * 1000), secrets.token_hex(16), challenge)

    def lines(self) -> tuple[str, str, str]:
        return str(self.time_ms), self.nonce, self.challenge

    def auth(self, mac: str) -> str:
        return f"{TAG}:{self.time_ms}:{self.nonce}:{self.challenge}:{mac}"


def signed_bytes(hello: m.Hello, stamp: Stamp) -> bytes:
    """The canonical bytes a Hello's HMAC covers."""
    peer = (hello.service, hello.instance, hello.host, str(hello.pid), str(hello.capacity))
    fields = (TAG, *peer, str(hello.rank), _endpoints(hello.endpoints), *stamp.lines())
    return "\n".join(fields).encode()


def _mac(secret: bytes, hello: m.Hello, stamp: Stamp) -> str:
    return hmac.new(secret, signed_bytes(hello, stamp), hashlib.sha256).hexdigest()


def sign(hello: m.Hello, secret: bytes, challenge: str, now: float | None = None) -> m.Hello:
    """`hello` with its `auth` set: a fresh nonce each call, answering the hub's
    `challenge` (from its `Challenge`; "" before the first)."""
    stamp = Stamp.new(challenge, now)
    hello.auth = stamp.auth(_mac(secret, hello, stamp))
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


def _status_mac(key: bytes, stamp: Stamp) -> str:
    text = "\n".join((TAG, "status", *stamp.lines()))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def sign_status(key: bytes, challenge: str, now: float | None = None) -> m.StatusRequest:
    """A StatusRequest signed with the status key (`status_key`, or a status.token's),
    answering the hub's `challenge`."""
    stamp = Stamp.new(challenge, now)
    return m.StatusRequest(auth=stamp.auth(_status_mac(key, stamp)))


def _parts(auth: str) -> tuple[Stamp, str] | None:
    """(stamp, HMAC hex) of an auth string; None when it is not one."""
    parts = auth.split(":")
    if len(parts) != 5 or parts[0] != TAG or not parts[1].isdigit():
        return None
    return Stamp(int(parts[1]), parts[2], parts[3]), parts[4]


class HelloAuth:
    """The hub's check of each Hello and status request against the run's secret and its
    challenge (drawn here: one per hub process)."""

    def __init__(self, secret: bytes, max_age_s: float = MAX_AGE_S) -> None:
        self.secret = secret
        self.challenge = new_challenge()
        self._status = status_key(secret)
        self._hellos = FreshNonces(max_age_s)
        self._requests = FreshNonces(max_age_s)

    def stale(self, auth: str) -> bool:
        """Whether `auth` (a Hello's or a status request's) is a signature for another
        challenge than this hub's (a first one, or one made for the hub before a restart):
        it is answered with the challenge, nothing else checked. One with no signature at all
        is refused by `check` instead (its sender lacks the secret)."""
        parts = _parts(auth)
        return parts is not None and not hmac.compare_digest(parts[0].challenge, self.challenge)

    def check(self, hello: m.Hello, now: float | None = None) -> str | None:
        """None if `hello` is signed with the secret, fresh and new; else why not."""
        parts = _parts(hello.auth)
        if parts is None:
            return "Hello carries no valid auth (is the run's secret given to this service?)"
        stamp, mac = parts
        if not hmac.compare_digest(mac, _mac(self.secret, hello, stamp)):
            return "Hello's auth does not match the run's secret"
        return self._fresh(self._hellos, stamp, "Hello", now)

    def check_status(self, request: m.StatusRequest, now: float | None = None) -> str | None:
        """None if `request` is signed with the status key, fresh and new; else why not."""
        parts = _parts(request.auth)
        if parts is None:
            return "status needs the run's secret or its status.token (--run-dir, --token-file)"
        stamp, mac = parts
        if not hmac.compare_digest(mac, _status_mac(self._status, stamp)):
            return "status request's auth does not match the run's secret"
        return self._fresh(self._requests, stamp, "status request", now)

    def _fresh(self, seen: FreshNonces, stamp: Stamp, what: str, now: float | None) -> str | None:
        if stamp.challenge != self.challenge:
            return f"{what} answers another hub's challenge (signed before this hub started)"
        stale = seen.check(stamp.time_ms, stamp.nonce, time.time() if now is None else now)
        return None if stale is None else f"{what} {stale}"


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
