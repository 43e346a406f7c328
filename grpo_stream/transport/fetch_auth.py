"""Weights only to members of the run: every WeightsRequest carries proof of the run's
secret, and under CURVE with per-role keys comes from a generator's or the evaluator's key (only
a generator's may make itself a relay); the trainer's weight
server and every relay refuse any other (`FetchGuard`), answer it with Error(code
"unauthorized") and log it (`weights.refused_fetch`, an error event, rate-limited).

A request's signature (`sign_fetch`): HMAC-SHA256 keyed with `derive(secret, "weights")`
over the canonical lines `v2`, `weights`, version, have, relay (or empty), direct (1/0), the
signing time in ms and a 16-byte random nonce; `auth = "v2:<time_ms>:<nonce>:<HMAC hex>"`.
It covers `relay`, so only a member makes a relay of an address.

Invariants:
- without the secret no request is served by a server that has one: a stranger gets no
  byte of the weights (compared with `hmac.compare_digest`);
- a captured request cannot be replayed to the same server: its nonce is remembered for
  `MAX_AGE_S`, and one signed further from the server's clock is refused; the memory holds
  only nonces of valid requests (bounded by the members' fetches, not a stranger's).

Not covered: without CURVE the weights travel in plaintext, so whoever reads the network
reads them (docs/guide/security.md).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

import structlog

from grpo_stream.config.transport import SecuritySettings
from grpo_stream.protocols.messages import Error, WeightsRequest
from grpo_stream.ratelimit import RateLimit
from grpo_stream.transport.curve import key_roles
from grpo_stream.transport.runsecret import MAX_AGE_S, WEIGHTS, FreshNonces, derive
from grpo_stream.transport.sockets import Server

log = structlog.get_logger()

TAG = "v2"
FETCHERS = frozenset({"generator", "evaluator"})
"""The CURVE roles that fetch weights (under per-role keys): the generators sample with them,
the evaluator evaluates each version it is due (it never relays)."""
RELAYS = frozenset({"generator"})
"""The CURVE roles whose fetch may name a relay (under per-role keys)."""


def _mac(key: bytes, request: WeightsRequest, time_ms: int, nonce: str) -> str:
    asked = (str(request.version), str(request.have), request.relay or "")
    fields = (TAG, WEIGHTS, *asked, "1" if request.direct else "0", str(time_ms), nonce)
    return hmac.new(key, "\n".join(fields).encode(), hashlib.sha256).hexdigest()


def sign_fetch(secret: bytes, request: WeightsRequest, now: float | None = None) -> WeightsRequest:
    """`request` with its `auth` set (a fresh nonce each call)."""
    time_ms = int((time.time() if now is None else now) * 1000)
    nonce = secrets.token_hex(16)
    mac = _mac(derive(secret, WEIGHTS), request, time_ms, nonce)
    request.auth = f"{TAG}:{time_ms}:{nonce}:{mac}"
    return request


class FetchGuard:
    """A weight server's (or relay's) check of each WeightsRequest: the run's secret when it
    has one, a fetching role's CURVE key under per-role keys (`FETCHERS`)."""

    def __init__(
        self, secret: bytes | None, security: SecuritySettings, max_age_s: float = MAX_AGE_S
    ) -> None:
        self._key = None if secret is None else derive(secret, WEIGHTS)
        roles = key_roles(security.keys_dir) if security.curve and security.keys_dir else {}
        self._keys = {k: role for k, role in roles.items() if role in FETCHERS}
        self._per_role = any(role is not None for role in roles.values())
        self._seen = FreshNonces(max_age_s)
        self._warn = RateLimit()  # any stranger can make a refusal repeat
        self.refused = 0  # requests refused (read for stats and tests)

    def admit(self, server: Server, peer: bytes, request: WeightsRequest) -> bool:
        """Whether to serve `request` (just received on `server` from `peer`); one that may
        not be served is answered with Error(code "unauthorized") and logged."""
        why = self.check(request, server.last_user_id)
        if why is None:
            return True
        self.refused += 1
        reply = Error(code="unauthorized", message=why, in_reply_to=WeightsRequest.KIND)
        server.send(peer, reply)
        if (count := self._warn.allow("weights.refused_fetch")) is not None:
            log.error("weights.refused_fetch", socket=server.name, reason=why, count=count)
        return False

    @property
    def guarded(self) -> bool:
        """Whether anything is checked (a secret, or per-role keys)."""
        return self._key is not None or self._per_role

    def check(
        self, request: WeightsRequest, user_id: str | None, now: float | None = None
    ) -> str | None:
        """None if `request` may be served; else why not (for the refusal and the log)."""
        if self._per_role:
            role = self._keys.get(user_id or "")
            if role is None:
                return (
                    f"CURVE key {user_id} is not a generator's or the evaluator's: it may not "
                    "fetch weights"
                )
            if request.relay and role not in RELAYS:
                return f"CURVE key {user_id} is the {role}'s: only a generator may relay weights"
        if self._key is None:
            return None
        parts = request.auth.split(":")
        if len(parts) != 4 or parts[0] != TAG or not parts[1].isdigit():
            return "weights request carries no proof of the run's secret"
        time_ms, nonce, mac = int(parts[1]), parts[2], parts[3]
        if not hmac.compare_digest(mac, _mac(self._key, request, time_ms, nonce)):
            return "weights request's proof does not match the run's secret"
        stale = self._seen.check(time_ms, nonce, time.time() if now is None else now)
        return None if stale is None else f"weights request {stale}"
