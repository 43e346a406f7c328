"""Wire messages of direct payloads (`hub.payloads = "direct"`): completions go from the
generator that sampled them to the scorer and the trainer that need them; the hub carries
only their metadata and references.

A generator keeps each group's `Rollout` in a bounded store served on its own ROUTER
(`grpo_stream.hub.payloads.store`) and sends the hub a `RolloutMeta` (ids, lease, version,
lengths, the digest). The hub asks a scorer to score by reference (`ScoreRef`) and sends the
trainer `TrainBatchRef` shards (references plus the hub's advantages, rewards and step
statistics); both fetch each group with a `PayloadRequest`, answered with the stored Rollout
itself or an `Error` (codes `PAYLOAD_ERRORS`). A receiver that cannot get or verify a payload
tells the hub with `PayloadLost`, and the hub generates those groups again.

Invariants:
- `digest` is `payload_digest` of the Rollout's canonical encoding (the codec is
  deterministic, so the fetcher recomputes it from what it decoded); a payload whose digest,
  group, version or lengths differ from the reference is refused, never trained or scored;
- a `PayloadRequest` is answered exactly once, in the order the requests came on that
  connection (one thread serves the store), so a fetcher matches replies by position;
- the hub, not the generator, supplies a ScoreRef's prompt and reference (the task's own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from grpo_stream.protocols.schema import Array, Message
from grpo_stream.protocols.structs import BatchTotals, SamplingParams, StepStats

DIGEST_BYTES = 16
"""blake2b digest size: 128 bits, hex on the wire (32 characters)."""

PAYLOAD_ERRORS = ("payload_unknown_group", "payload_wrong_digest", "payload_evicted")
"""Error codes of a payload store: never stored here, stored with another digest, evicted."""


@dataclass(eq=False)
class RolloutMeta(Message):
    """A generator tells the hub one group's completions are ready in its payload store."""

    KIND: ClassVar[str] = "rollout_meta"
    lease_id: int
    group_id: int
    instance: str
    policy_version: int  # the oldest token's version, as in the Rollout
    source: str  # the generator's payload store (a ROUTER endpoint)
    digest: str  # payload_digest of the stored Rollout
    prompt_len: int
    completion_lens: Array  # int64 (G,)
    truncated: list[bool]
    gen_seconds: float
    sampling: SamplingParams


@dataclass(eq=False)
class ScoreRef(Message):
    """The hub asks a scorer for one group's rewards; the completions are at `source`."""

    KIND: ClassVar[str] = "score_ref"
    lease_id: int
    group_id: int
    prompt: str
    reference: dict[str, Any]
    source: str
    digest: str


@dataclass(eq=False)
class PayloadRequest(Message):
    """Fetch one group's Rollout from a payload store (answered with it, or an Error)."""

    KIND: ClassVar[str] = "payload_request"
    group_id: int
    digest: str


@dataclass(eq=False)
class TrainBatchRef(Message):
    """A TrainBatch by reference: N groups at their sources, with the hub's advantages.

    Per completion (flat, G per group, `group_offsets` into them): its length, reward,
    advantage and whether it carries a reward (valid). The trainer fetches every group,
    checks it against this, and builds the TrainBatch the hub would have sent
    (`grpo_stream.hub.payloads.refs.materialize`)."""

    KIND: ClassVar[str] = "train_batch_ref"
    step: int
    group_ids: Array  # int64 (N,)
    sources: list[str]  # (N,)
    digests: list[str]  # (N,)
    versions: Array  # int64 (N,): each group's policy version
    group_offsets: Array  # int64 (N+1,)
    completion_lens: Array  # int64 (sum of G,)
    rewards: Array  # float32 (sum of G,)
    advantages: Array  # float32 (sum of G,)
    valid: Array  # uint8 (sum of G,)
    totals: BatchTotals
    sampling: SamplingParams
    stats: StepStats


@dataclass(eq=False)
class PayloadLost(Message):
    """A scorer or the trainer could not get (or verify) these groups' payloads: the hub
    generates them again. From the trainer, `step`/`trainer_version`/`attempt` name the
    batch it could not build (-1 from a scorer)."""

    KIND: ClassVar[str] = "payload_lost"
    group_ids: list[int]
    reason: str
    step: int = -1
    trainer_version: int = -1
    attempt: int = 0
    codes: list[str] = field(default_factory=list)
    """Why, per group: a `PAYLOAD_ERRORS` code, "unreachable", "mismatch", or "refused" (a
    scorer's content checks failed: `grpo_stream.hub.content`)."""


PAYLOAD_MESSAGES: dict[str, type[Message]] = {
    cls.KIND: cls for cls in (RolloutMeta, ScoreRef, PayloadRequest, TrainBatchRef, PayloadLost)
}
"""The direct-payload kinds (with the core kinds in `kinds.MESSAGES`)."""
