"""Names both sides of the session must agree on."""

from __future__ import annotations

import secrets

UNREGISTERED = "unregistered"
"""Error code the hub answers a service it does not know with: the service says Hello again."""


def session_identity(instance: str) -> str:
    """ZeroMQ identity of a service's main socket: its instance and 8 random hex digits, new
    per process, so nobody can predict it and connect under it first (the hub's ROUTER
    refuses a second connection with an identity in use) and a restart is a new identity."""
    return f"{instance}.{secrets.token_hex(4)}"


def beat_identity(identity: str) -> str:
    """ZeroMQ identity of a service's heartbeat socket: its own, so a long model load or
    generation on the main socket never delays a beat; the hub accepts beats for an instance
    only from this identity or the instance's main one."""
    return f"{identity}.hb"
