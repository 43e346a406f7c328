"""Sealed messages: every message a service sends the hub after its Hello carries a MAC
with the session's key, so it is bound to the session that Hello opened, not to a routing
identity a stranger can connect with.

A seal is one ZeroMQ frame sent before the message's header frame:

    0xC1 "S1" | channel (1 byte) | seq (8 bytes, big-endian) | tag (16 bytes)

0xC1 is the one byte msgpack never uses, so no header frame starts with it: a receiver tells
a seal from a header by its first byte. The tag is HMAC-SHA256 (truncated to 16 bytes) with
the session key over the seal's first 12 bytes, then, for each frame of the message in
order, its length (8 bytes, little-endian) and its bytes. HMAC-SHA256 rather than keyed
BLAKE2b: OpenSSL's SHA-256 uses the CPU's SHA extensions, measured faster here on 64 KiB.

Invariants:
- a `Sealer` numbers its messages 1, 2, 3, ... on its channel; an `Opener` accepts a seal only
  if its tag is right (compared in constant time) and its number is above every number it
  accepted on that channel: a captured message cannot be replayed, nor moved to another
  channel or session;
- each channel is one connection (the service's main socket, its heartbeat socket), and
  ZeroMQ keeps one connection's messages in order, so an honest sender's numbers arrive
  increasing.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAGIC = b"\xc1S1"
"""The first bytes of every seal frame (0xC1: never a msgpack byte)."""
SEAL_BYTES = 28
TAG_BYTES = 16
MAIN = 0
"""The channel of a service's main socket."""
BEATS = 1
"""The channel of its heartbeat socket."""

Buffer = bytes | memoryview


def _tag(base: Any, head: bytes, frames: Sequence[Buffer]) -> bytes:
    mac = base.copy()
    mac.update(head)
    for frame in frames:
        mac.update(len(frame).to_bytes(8, "little"))
        mac.update(frame)
    return bytes(mac.digest()[:TAG_BYTES])


def _base(key: bytes) -> Any:
    return hmac.new(key, digestmod=hashlib.sha256)


class Sealer:
    """Seals the messages of one channel with one session key (sender side)."""

    def __init__(self, key: bytes, channel: int) -> None:
        self.key = key
        self.channel = channel
        self.seq = 0
        self._base = _base(key)

    def seal(self, frames: Sequence[Buffer]) -> bytes:
        """The seal frame for the next message `frames` (the codec's frames)."""
        self.seq += 1
        head = MAGIC + bytes([self.channel]) + self.seq.to_bytes(8, "big")
        return head + _tag(self._base, head, frames)


@dataclass(frozen=True)
class Seal:
    """A received seal and the frames it covers."""

    channel: int
    seq: int
    tag: bytes
    head: bytes
    frames: Sequence[Buffer]


def is_seal(frame: Buffer) -> bool:
    """Whether `frame` is a seal (not a message's header)."""
    return len(frame) >= 1 and bytes(frame[:1]) == MAGIC[:1]


def parse(frame: Buffer, frames: Sequence[Buffer]) -> Seal | None:
    """The seal in `frame` over `frames`; None when it is not a well-formed seal."""
    raw = bytes(frame)
    if len(raw) != SEAL_BYTES or not raw.startswith(MAGIC):
        return None
    return Seal(raw[3], int.from_bytes(raw[4:12], "big"), raw[12:], raw[:12], frames)


class Opener:
    """Checks the seals of one session (receiver side): the key and each channel's last
    accepted number."""

    def __init__(self, key: bytes) -> None:
        self._base = _base(key)
        self._last: dict[int, int] = {}

    def open(self, seal: Seal | None) -> str | None:
        """None if `seal` is this session's and new; else why it is refused."""
        if seal is None:
            return "message not sealed with the session's key (send Hello first)"
        if not hmac.compare_digest(seal.tag, _tag(self._base, seal.head, seal.frames)):
            return "message sealed with another key than this session's"
        if seal.seq <= self._last.get(seal.channel, 0):
            return f"message number {seal.seq} on channel {seal.channel} was seen (replayed)"
        self._last[seal.channel] = seal.seq
        return None
