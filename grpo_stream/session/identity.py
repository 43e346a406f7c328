"""Names both sides of the session must agree on."""

from __future__ import annotations

UNREGISTERED = "unregistered"
"""Error code the hub answers a service it does not know with: the service says Hello again."""


def beat_identity(instance: str, pid: int) -> str:
    """ZeroMQ identity of a service's heartbeat socket: its own, so a long model load or
    generation on the main socket never delays a beat; the hub accepts beats for an instance
    only from this identity or the instance's main one."""
    return f"{instance}.hb.{pid}"
