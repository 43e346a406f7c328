"""The hub's send journal: what left for the trainer, made durable before it leaves.

Invariant (exactly-once across a hub crash): a TrainBatch is sent only after its record
(sequence number, step, trainer version and attempt, the groups and which of them were
first uses, and the encoded shards) is appended to this file and fsynced. The hub
checkpoint stores the last sequence number it covers and is followed by `reset`; on
restore every later record is applied again to the restored ledger and buffer (its groups
are trained, never sent again) and the last one answers a repeated request for its step
with the same bytes. A record torn by a crash mid-append was never sent: it is ignored.
So after any hub crash, the groups counted trained are exactly those in batches sent.

Records are a 4-byte big-endian length and a msgpack map; never pickle.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import decode, encode
from grpo_stream.protocols.payloads import TrainBatchRef

_LEN = struct.Struct(">I")


@dataclass
class Sent:
    """One served step: what the trainer ranks were sent for (step, version, attempt)."""

    seq: int
    step: int
    version: int
    attempt: int
    groups: list[int]
    first: list[bool]  # first use of each group (counted trained then)
    shards: list[list[bytes]]  # rank r's TrainBatch, encoded

    @classmethod
    def of(
        cls,
        seq: int,
        request: m.BatchRequest,
        groups: list[int],
        first: list[bool],
        shards: list[m.TrainBatch] | list[TrainBatchRef],
    ) -> Sent:
        frames = [[bytes(f) for f in encode(batch)] for batch in shards]
        return cls(
            seq, request.step, request.trainer_version, request.attempt, groups, first, frames
        )

    def answers(self, request: m.BatchRequest) -> bool:
        """True if `request` asks again for exactly this step (an idempotent repeat)."""
        key = (request.step, request.trainer_version, request.attempt)
        return key == (self.step, self.version, self.attempt) and request.rank < len(self.shards)

    def shard(self, rank: int) -> m.TrainBatch | TrainBatchRef:
        batch = decode(self.shards[rank])
        if not isinstance(batch, m.TrainBatch | TrainBatchRef):
            raise ValueError(f"journal record {self.seq} holds a {batch.KIND}, not a train_batch")
        return batch

    def first_uses(self) -> list[int]:
        return [g for g, first in zip(self.groups, self.first, strict=True) if first]

    def to_state(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "step": self.step,
            "version": self.version,
            "attempt": self.attempt,
            "groups": list(self.groups),
            "first": list(self.first),
            "shards": self.shards,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Sent:
        return cls(
            seq=int(state["seq"]),
            step=int(state["step"]),
            version=int(state["version"]),
            attempt=int(state["attempt"]),
            groups=[int(g) for g in state["groups"]],
            first=[bool(f) for f in state["first"]],
            shards=[[bytes(f) for f in shard] for shard in state["shards"]],
        )


class SendJournal:
    """Append-only, fsynced file of `Sent` records since the last hub checkpoint."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: Sent) -> None:
        data = msgpack.packb(record.to_state(), use_bin_type=True)
        with self.path.open("ab") as fh:
            fh.write(_LEN.pack(len(data)) + data)
            fh.flush()
            os.fsync(fh.fileno())

    def read(self) -> list[Sent]:
        """Every complete record, oldest first (a torn tail is left out)."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        out, pos = [], 0
        while pos + _LEN.size <= len(data):
            (size,) = _LEN.unpack_from(data, pos)
            end = pos + _LEN.size + size
            if end > len(data):
                break  # torn by a crash mid-append: that batch never left
            state = msgpack.unpackb(data[pos + _LEN.size : end], raw=False)
            out.append(Sent.from_state(state))
            pos = end
        return out

    def reset(self) -> None:
        """The checkpoint now covers every record: start empty."""
        self.path.unlink(missing_ok=True)
