"""Wire messages of on-policy distillation (`algo.distill.teacher`): the hub asks a teacher
service for the per-token log-probs of a group's completions under the teacher model.

The teacher pulls work with credits like a scorer; the hub leases it one group at a time
(`TeachRequest`: the token ids, so no text is tokenized twice) and the teacher answers with
`Taught`: log p_teacher(o_t | prompt, o_<t) for every completion token, in the order of
`completion_ids`, at the temperature the completions were sampled with.

Invariants:
- `Taught.logprobs` has one finite, non-positive value per completion token, or `error` is
  set and `logprobs` is empty (the teacher could not score the group: the hub counts it
  failed, never trains it without its teacher);
- a `Taught` for a group not awaiting its teacher (a duplicate, or a lease that expired and
  went to another teacher) is dropped and counted by the hub's ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from grpo_stream.protocols.schema import Array, Message


@dataclass(eq=False)
class TeachRequest(Message):
    """The hub leases one group to a teacher: score its completions' tokens."""

    KIND: ClassVar[str] = "teach_request"
    lease_id: int
    group_id: int
    prompt_ids: Array  # int32 (Tp,)
    completion_ids: Array  # int32 (sum of completion lengths,): all G concatenated
    completion_offsets: Array  # int64 (G+1,)
    temperature: float  # the sampling temperature: the teacher's log-probs are tempered alike


@dataclass(eq=False)
class Taught(Message):
    """A teacher returns the log-probs of one group's completion tokens."""

    KIND: ClassVar[str] = "taught"
    lease_id: int
    group_id: int
    logprobs: Array  # float32, same length as completion_ids; empty when `error` is set
    error: str = ""  # why the group could not be scored ("" when it was)


TEACHING_MESSAGES: dict[str, type[Message]] = {cls.KIND: cls for cls in (TeachRequest, Taught)}
"""The distillation kinds (with the core kinds in `kinds.MESSAGES`)."""
