"""Which addresses only this machine can reach, and why nothing may bind the others
unguarded.

Invariant: `exposure_error` is "" for a loopback address (tcp:// on 127.x.x.x, localhost or
::1; ipc://; inproc://), under security.curve, or for an owner holding the run's secret
(`guarded`); for any other address it is one line naming the setting and what would guard
it. Every binding socket asks it before it binds (`grpo_stream.transport.sockets`), and so
does `grpo-stream run` before the hub starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_stream.config.transport import SecuritySettings


LOOPBACK_HOSTS = ("localhost", "::1", "[::1]")


def is_loopback(address: str) -> bool:
    """Whether only this machine can reach `address`: tcp:// on 127.x.x.x, localhost or ::1,
    ipc:// (file permissions guard it) and inproc://. Every other address (0.0.0.0, *, an
    interface, a host name) is exposed."""
    scheme, _, rest = address.partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    host = rest.rsplit(":", 1)[0]
    return scheme == "tcp" and (host.startswith("127.") or host in LOOPBACK_HOSTS)


def exposure_error(address: str, security: SecuritySettings, guarded: bool, setting: str) -> str:
    """Why nothing may bind `address` unguarded ("" when it may): beyond loopback a server
    needs CURVE or the run's secret, so a stranger on the network cannot act in the run."""
    if guarded or security.curve or is_loopback(address):
        return ""
    return (
        f"{setting}={address} is reachable from other hosts and nothing guards it: give the "
        "run's secret (security.secret_file, --secret-file or GRPO_STREAM_SECRET) or turn on "
        "security.curve"
    )
