"""The protocol's one error: `ProtocolError`, raised by encoding, decoding and array conversion."""

from __future__ import annotations


class ProtocolError(Exception):
    """A message could not be encoded or decoded; `code` says why (see SPEC.md)."""

    def __init__(self, code: str, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.kind = kind
