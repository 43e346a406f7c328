"""The context-parallel groups of the trainer's ranks, and the batch each group shares.

With `trainer.context_parallel = N` the W ranks form W / N groups of N consecutive ranks
(global rank = data_rank * N + place): the ranks of one group hold the same sequences and
split each over them; different groups hold different shards of the step, as DDP ranks do.
The first rank of a group (its leader) asks the hub for its group's shard and hands it to
the others over torch.distributed (`share_batch`), so the hub sees W / N trainer ranks.

Invariants:
- `context_groups` and `share_batch` are collective: every rank calls them at the same
  point (`context_groups` once, at start; `share_batch` once per step, the leader with its
  batch or None when it stops, which stops the others too);
- a shared batch is the leader's TrainBatch, encoded and decoded by the wire codec (never
  pickled), so every rank of a group trains on identical tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from grpo_stream.collectives import collective_device
from grpo_stream.protocols.codec import decode, encode
from grpo_stream.protocols.messages import TrainBatch

NO_BATCH = -1
"""The frame count a leader broadcasts instead of a batch: it stopped, so does its group."""
MAX_FRAMES = 64
"""Frames of a shared TrainBatch, at most (its header and one per array: about 15)."""


@dataclass(frozen=True)
class ContextGroup:
    """This rank's place among the context-parallel ranks."""

    size: int  # N: ranks that split each sequence
    place: int  # this rank's index in its group, 0 .. N-1: it holds the place-th slice
    leader: int  # global rank of the group's first rank
    data_rank: int  # which shard of the step the group trains
    data_ranks: int  # groups (the hub splits each step this many ways)
    group: Any  # the torch.distributed process group of the N ranks

    @property
    def leads(self) -> bool:
        """This rank asks the hub for the group's batch."""
        return self.place == 0


def context_groups(degree: int, rank: int, world: int) -> ContextGroup:
    """Collective: the process group of each N consecutive ranks (every rank creates every
    group, in the same order, as torch.distributed requires); this rank's among them."""
    if world % degree:
        raise ValueError(
            f"trainer.context_parallel = {degree} needs a multiple of {degree} ranks; this "
            f"trainer has {world} (start it with `grpo-stream up`, which runs trainer.ranks)"
        )
    dist = torch.distributed
    mine = None
    for first in range(0, world, degree):
        group = dist.new_group(list(range(first, first + degree)))
        if first <= rank < first + degree:
            mine = group
    return ContextGroup(
        size=degree,
        place=rank % degree,
        leader=rank - rank % degree,
        data_rank=rank // degree,
        data_ranks=world // degree,
        group=mine,
    )


def share_batch(
    ctx: ContextGroup, batch: TrainBatch | None, poll: Callable[[], object]
) -> TrainBatch | None:
    """Collective over the group: the leader's `batch` on every rank (None: the leader
    stopped). The others `poll` (their session: heartbeats, a Shutdown) while they wait."""
    dist = torch.distributed
    device = collective_device()
    frames = [bytes(f) for f in encode(batch)] if ctx.leads and batch is not None else []
    if len(frames) > MAX_FRAMES:
        raise ValueError(f"a TrainBatch of {len(frames)} frames: at most {MAX_FRAMES} are shared")
    stopped = ctx.leads and batch is None
    values = [NO_BATCH] if stopped else [len(frames), *(len(f) for f in frames)]
    head = torch.tensor(values + [0] * (MAX_FRAMES + 1 - len(values)), device=device)
    work = dist.broadcast(head, src=ctx.leader, group=ctx.group, async_op=True)
    while not ctx.leads and not work.is_completed():
        poll()
    work.wait()
    count = int(head[0])
    if count == NO_BATCH:
        return None
    lengths = [int(n) for n in head[1 : 1 + count].tolist()]
    if ctx.leads:
        payload = torch.frombuffer(bytearray(b"".join(frames)), dtype=torch.uint8).to(device)
    else:
        payload = torch.empty(sum(lengths), dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=ctx.leader, group=ctx.group)
    if ctx.leads:
        return batch
    raw = payload.cpu().numpy().tobytes()
    ends = np.cumsum(lengths).tolist()
    message = decode([raw[end - n : end] for n, end in zip(lengths, ends, strict=True)])
    if not isinstance(message, TrainBatch):
        raise TypeError(f"the context group's leader shared a {type(message).__name__}")
    return message
