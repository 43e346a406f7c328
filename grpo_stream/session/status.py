"""Asking a hub for its status (StatusRequest -> Status): the one client every reader of a
run's live state goes through (`grpo-stream status`, the dashboard).

Access rules live here: the caller passes the run's `SecuritySettings` (CURVE keys, and the
run's status key where the hub has a secret: `grpo_stream.hub.auth.status_credential`), so a
reader follows whatever the hub requires.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.hub.auth import sign_status
from grpo_stream.protocols import messages as m
from grpo_stream.transport.sockets import Client, Context, close_context, make_context

POLL_MS = 100
"""How long each receive waits before the deadline is checked again."""


class StatusUnavailable(RuntimeError):
    """The hub did not answer in time, or refused; the message says which and where."""


@dataclass(frozen=True)
class HubStatus:
    """What the hub said: its services (display fields), counters and policy version."""

    hub: str
    policy_version: int
    counters: dict[str, Any]
    services: list[dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        return {
            "hub": self.hub,
            "policy_version": self.policy_version,
            "counters": dict(self.counters),
            "services": list(self.services),
        }


class StatusClient:
    """A DEALER to one hub that asks for its status; reused across polls (`close` it)."""

    def __init__(
        self,
        address: str,
        security: SecuritySettings,
        identity: str | None = None,
        key: bytes | None = None,
    ) -> None:
        self.address = address
        self.key = key  # the status key each request is signed with (None: unsigned)
        self.challenge = ""  # the hub's, from its Challenge: signed into each request
        self._ctx: Context = make_context()
        self._client = Client(
            self._ctx, address, TransportSettings(), security, identity or f"status-{os.getpid()}"
        )

    def ask(self, timeout_s: float) -> HubStatus:
        """The hub's status now; raises StatusUnavailable after `timeout_s` without one."""
        while self._client.recv(timeout_ms=0) is not None:
            pass  # an answer that came after an earlier ask gave up: not this one's
        self._client.send(self._request())
        deadline = time.monotonic() + timeout_s
        challenged = 0
        while time.monotonic() < deadline:
            msg = self._client.recv(timeout_ms=POLL_MS)
            if isinstance(msg, m.Challenge) and self.key is not None and challenged < 2:
                challenged += 1  # the first ask of this hub (or it restarted): sign for it
                self.challenge = msg.challenge
                self._client.send(self._request())
                continue
            if isinstance(msg, m.Challenge):
                raise StatusUnavailable(
                    f"the hub at {self.address} needs the run's secret or its status.token "
                    "(--run-dir, --token-file)"
                )
            if isinstance(msg, m.Status):
                return HubStatus(
                    self.address, msg.policy_version, dict(msg.counters), list(msg.services)
                )
            if isinstance(msg, m.Error):
                raise StatusUnavailable(
                    f"the hub at {self.address} refused: {msg.message} ({msg.code})"
                )
        raise StatusUnavailable(f"no answer from the hub at {self.address} within {timeout_s:.0f}s")

    def _request(self) -> m.StatusRequest:
        if self.key is None:
            return m.StatusRequest()
        return sign_status(self.key, self.challenge)

    def close(self) -> None:
        self._client.close()
        close_context(self._ctx)


def ask_status(
    address: str, security: SecuritySettings, timeout_s: float, key: bytes | None = None
) -> HubStatus:
    """One status request on a fresh connection (signed with `key` when given)."""
    client = StatusClient(address, security, key=key)
    try:
        return client.ask(timeout_s)
    finally:
        client.close()
