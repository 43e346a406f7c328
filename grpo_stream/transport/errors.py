"""Named transport errors: each message says which address and which setting are involved.

Invariant: every error a service can hit while talking to a peer is a `TransportError`, so a
service loop catches one type; none of them is raised for a malformed *incoming* message (those
are counted and logged by the socket wrappers, never raised).
"""

from __future__ import annotations


class TransportError(Exception):
    """Base of every error raised by grpo_stream.transport."""


class SendTimeout(TransportError):
    """A client could not queue a message within transport.io_timeout_ms (peer not draining)."""


class HandshakeTimeout(TransportError):
    """No Welcome arrived within transport.handshake_timeout_s."""


class HandshakeRefused(TransportError):
    """The hub answered Hello with an Error."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class KeysError(TransportError):
    """CURVE key files are missing or unusable."""


class WeightsTimeout(TransportError):
    """Not every chunk of a weights version arrived within the fetch timeout."""


class WeightsError(TransportError):
    """The weight server refused a request, or sent chunks that do not form one version."""


class ExposedBind(TransportError):
    """A server would bind beyond loopback with neither CURVE nor the run's secret."""
