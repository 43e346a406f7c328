"""Typed wire messages: one dataclass per message kind, and the registry KIND -> class
(the field types they may use and the base classes: protocols/schema.py; the `Struct`
records inside them: protocols/structs.py, re-exported here).

Invariants:
- Every message class has a unique `KIND` and appears in `kinds.MESSAGES`.
- Field types are limited to what the codec can carry (`schema.FIELD_KINDS`): int, float, str,
  bool, `X | None` of those, list[str|int|float|bool], dict[str, Any] and
  list[dict[str, Any]] of msgpack-native values, `Array` and `list[Array]`, and a `Struct`
  (`X` or `X | None`): a typed record of scalar and list fields that travels as a map.
- Load-bearing data is typed (a `Struct` or plain fields), never read back from a free-form
  map with a default: the addresses a trainer serves travel as `Endpoints` (in `Hello` and
  `Welcome`). The `dict[str, Any]` fields left are free-form by nature: `Hello`'s hardware
  fingerprint (nested device lists, NVML or CPU, advisory: it sets work shares); `Welcome`'s
  config (the RunConfig as JSON, validated by pydantic on receipt); the task references (each
  task's own answer format, read by its reward function, and always the hub's: a generator
  sends none); `Heartbeat.stats` and `Status`' services and counters (display only: shown by
  `grpo-stream status`, never read back by the hub).
- Ragged data is a flat array plus an int64 offsets array (len = items + 1), never lists
  of lists: item i is `flat[offsets[i]:offsets[i + 1]]`.
- Arrays decode as numpy arrays (read-only views over the received frames are allowed);
  `encode` also accepts torch tensors in Array fields (see `grpo_stream.protocols.codec`).
- Equality compares arrays by dtype, shape and bytes (so NaN == NaN bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from grpo_stream.protocols.schema import Array as Array
from grpo_stream.protocols.schema import Message as Message
from grpo_stream.protocols.schema import Struct as Struct
from grpo_stream.protocols.structs import BatchTotals as BatchTotals
from grpo_stream.protocols.structs import Endpoints as Endpoints
from grpo_stream.protocols.structs import GeneratorStats as GeneratorStats
from grpo_stream.protocols.structs import SamplingParams as SamplingParams
from grpo_stream.protocols.structs import ScorerStats as ScorerStats
from grpo_stream.protocols.structs import StepStats as StepStats


def _empty_uint8() -> Array:
    return np.zeros(0, dtype=np.uint8)


def _empty_float32() -> Array:
    return np.zeros(0, dtype=np.float32)


def _empty_int64() -> Array:
    return np.zeros(0, dtype=np.int64)


@dataclass(eq=False)
class Hello(Message):
    """A service announces itself to the hub (first message on connect)."""

    KIND: ClassVar[str] = "hello"
    service: str
    instance: str
    host: str
    pid: int
    capacity: int
    rank: int = 0
    fingerprint: dict[str, Any] = field(default_factory=dict)
    endpoints: Endpoints | None = None
    """What a rank-0 trainer serves (None from every other service)."""
    auth: str = ""
    """The Hello's signature with the run's secret over its fields and the hub's current
    challenge (`grpo_stream.hub.auth`)."""


@dataclass(eq=False)
class Challenge(Message):
    """The hub's answer to a signed request (Hello, StatusRequest) that does not answer the
    hub's current challenge: sign it again with this one. A hub draws a new challenge each
    time it starts, so nothing signed for a hub before its restart is accepted after it."""

    KIND: ClassVar[str] = "challenge"
    challenge: str
    """32 hex digits, random per hub process."""
    in_reply_to: str
    """The kind of the request to sign again (hello or status_request)."""


@dataclass(eq=False)
class Welcome(Message):
    """The hub's answer to Hello: the run's config, its digest, peer addresses, policy version."""

    KIND: ClassVar[str] = "welcome"
    run_id: str
    config: dict[str, Any]
    config_digest: str
    peers: Endpoints | None
    """The trainer's endpoints (None until a rank-0 trainer announced them)."""
    policy_version: int


@dataclass(eq=False)
class Heartbeat(Message):
    """A service is alive; with its round trip to the hub and, from a generator or a scorer,
    its counters."""

    KIND: ClassVar[str] = "heartbeat"
    instance: str
    stats: dict[str, Any] = field(default_factory=dict)  # display only (`status`), free-form
    hub_rtt_s: float | None = None
    """Its last Hello -> Welcome round trip (the latency term of the device score)."""
    generator: GeneratorStats | None = None
    """A generator's counters (None from other services)."""
    scorer: ScorerStats | None = None
    """A scorer's counters (None from other services)."""


@dataclass(eq=False)
class WorkRequest(Message):
    """A worker asks the hub for up to `credits` more units of work (prompts or groups)."""

    KIND: ClassVar[str] = "work_request"
    instance: str
    credits: int


@dataclass(eq=False)
class PromptBatch(Message):
    """The hub leases P prompts to a generator: sample `group_size` completions for each."""

    KIND: ClassVar[str] = "prompt_batch"
    lease_id: int
    group_ids: Array  # int64 (P,)
    prompts: list[str]
    references: list[dict[str, Any]]
    group_size: int
    sampling: SamplingParams
    min_version: int


@dataclass(eq=False)
class Rollout(Message):
    """A generator returns the G completions of one prompt with their behaviour log-probs."""

    KIND: ClassVar[str] = "rollout"
    lease_id: int
    group_id: int
    instance: str
    policy_version: int
    prompt_ids: Array  # int32 (Tp,)
    completion_ids: Array  # int32 (sum of completion lengths,): all G concatenated
    completion_offsets: Array  # int64 (G+1,)
    logprobs: Array  # float32, same length as completion_ids
    texts: list[str]
    truncated: list[bool]
    gen_seconds: float
    sampling: SamplingParams  # echoed from the PromptBatch
    loss_mask: Array = field(default_factory=_empty_uint8)
    """Episodes: uint8, same length as completion_ids, 1 on sampled tokens and 0 on the
    environment's; logprobs are 0.0 where it is 0. Empty: every completion token is sampled."""
    episode_rewards: Array = field(default_factory=_empty_float32)
    """Episodes: float32 (G,), each episode's outcome reward from its environment (the sum
    of its turn rewards; NaN where the episode failed). The hub scores such a group itself,
    without a scorer. Empty: a single-turn rollout for the scorers."""
    turn_rewards: Array = field(default_factory=_empty_float32)
    """Episodes: float32 (all turns,), each policy turn's reward, episode by episode."""
    turn_starts: Array = field(default_factory=_empty_int64)
    """Episodes: int64 (all turns,), where each policy turn begins in its completion."""
    turn_offsets: Array = field(default_factory=_empty_int64)
    """Episodes: int64 (G+1,), episode i's turns are turn_rewards[turn_offsets[i]:...[i+1]]."""
    errors: list[str] = field(default_factory=list)
    """Episodes: one line per failed episode, "episode[i]: cause"."""
    token_version_starts: Array = field(default_factory=_empty_int64)
    """In-flight updates: int64 (R,), where in completion_ids each run of tokens sampled with
    one weights version begins (0 first, increasing). Empty: policy_version sampled them all."""
    token_versions: Array = field(default_factory=_empty_int64)
    """In-flight updates: int64 (R,), the version of each run; policy_version is the oldest
    (their minimum), and staleness counts from it."""


@dataclass(eq=False)
class ScoreRequest(Message):
    """The hub asks a scorer for the rewards of one group's completions."""

    KIND: ClassVar[str] = "score_request"
    lease_id: int
    group_id: int
    prompt: str
    completions: list[str]
    reference: dict[str, Any]


@dataclass(eq=False)
class Scored(Message):
    """A scorer returns one group's rewards (NaN where a reward function failed)."""

    KIND: ClassVar[str] = "scored"
    lease_id: int
    group_id: int
    rewards: Array  # float32 (G,)
    component_names: list[str]
    components: Array  # float32 (C, G)
    errors: list[str]


@dataclass(eq=False)
class BatchRequest(Message):
    """A trainer rank asks the hub for the batch of `step`."""

    KIND: ClassVar[str] = "batch_request"
    step: int
    trainer_version: int
    rank: int = 0
    world_size: int = 1
    attempt: int = 0  # times this step was skipped (rolled back): a new attempt, new groups


@dataclass(eq=False)
class TrainBatch(Message):
    """The hub sends S sequences (from N groups) with advantages for one trainer step."""

    KIND: ClassVar[str] = "train_batch"
    step: int
    group_ids: Array  # int64 (N,)
    input_ids: Array  # int32 (sum of sequence lengths,): prompt + completion of each sequence
    seq_offsets: Array  # int64 (S+1,)
    prompt_lens: Array  # int32 (S,)
    behaviour_logprobs: Array  # float32 (completion tokens,) in sequence order
    advantages: Array  # float32 (S,)
    rewards: Array  # float32 (S,)
    versions: Array  # int32 (S,): policy version that generated each sequence
    group_offsets: Array  # int64 (N+1,): group i's sequences are [o[i], o[i+1])
    totals: BatchTotals  # the whole step's loss normalisers (all ranks' shards)
    sampling: SamplingParams  # how every sequence in it was sampled
    stats: StepStats
    loss_mask: Array = field(default_factory=_empty_uint8)
    """uint8, like behaviour_logprobs (completion tokens): 1 where the loss applies (sampled
    tokens), 0 on environment tokens. Empty: every completion token is trained."""
    token_advantages: Array = field(default_factory=_empty_float32)
    """float32, like behaviour_logprobs: per-token advantages (algo.returns = "per_turn"),
    replacing `advantages` for the loss. Empty: each sequence's `advantages` value."""


@dataclass(eq=False)
class WeightsAnnounce(Message):
    """The trainer has published a complete new weights version."""

    KIND: ClassVar[str] = "weights_announce"
    version: int
    num_tensors: int
    total_bytes: int
    checksum: int = 0
    """The version's checksum (xxh3-64 of its tensor checksums, `transport.delta`)."""


@dataclass(eq=False)
class WeightsRequest(Message):
    """A generator asks the weight server for a version (-1 = the latest)."""

    KIND: ClassVar[str] = "weights_request"
    version: int
    have: int = -1
    """The version the fetcher holds complete (-1: none); the server may send a delta from it."""
    relay: str | None = None
    """Where the fetcher serves what it receives to others (None: it does not relay)."""
    direct: bool = False
    """Serve from this server, never redirect (a fetcher whose relay failed)."""
    auth: str = ""
    """The request's signature with the run's secret (`transport.runsecret.sign_fetch`):
    a weight server or relay with the secret serves no request without a valid, fresh and
    unseen one (only members of the run read its weights)."""


@dataclass(eq=False)
class WeightsChunk(Message):
    """Chunk `index` of `count` of a weights version: named tensors, one frame each."""

    KIND: ClassVar[str] = "weights_chunk"
    version: int
    index: int
    count: int
    names: list[str]
    tensors: list[Array]
    base: int = -1
    """The version the `xor_zstd` tensors are deltas against (-1: every tensor is raw)."""
    encodings: list[str] = field(default_factory=list)
    """Per tensor: "raw" (its bytes) or "xor_zstd" (uint8 zstd frame of bits XOR base bits)."""
    checksums: list[int] = field(default_factory=list)
    """Per tensor: xxh3-64 of the reconstructed tensor's bytes."""
    checksum: int = 0
    """The whole version's checksum (as in WeightsAnnounce), the same in every chunk."""


@dataclass(eq=False)
class WeightsRedirect(Message):
    """The weight server's answer to a WeightsRequest: fetch this version from a relay."""

    KIND: ClassVar[str] = "weights_redirect"
    version: int
    base: int
    """The `have` the relay is being served with (its stream is a delta from it)."""
    address: str
    """The relay's ROUTER endpoint."""
    checksum: int
    """The version's checksum as the trainer announced it: the fetcher refuses a relay's
    chunks that carry or add up to another one."""


@dataclass(eq=False)
class StatusRequest(Message):
    """Ask the hub for the run's status."""

    KIND: ClassVar[str] = "status_request"
    auth: str = ""
    """Signed with the run's status key and the hub's current challenge
    (`grpo_stream.hub.auth`): a hub with a secret answers no request without a valid, fresh,
    unseen one."""


@dataclass(eq=False)
class Status(Message):
    """The hub's view of the run: services, counters, current policy version."""

    KIND: ClassVar[str] = "status"
    services: list[dict[str, Any]]
    counters: dict[str, Any]
    policy_version: int


@dataclass(eq=False)
class RolloutEvidence(Message):
    """A trainer rank's evidence on the groups it just trained: per group, the mean absolute
    gap between its own log-probs and the generator's behaviour log-probs per completion
    token, the tokens counted, and how many versions behind the trained version the group
    was (the hub quarantines a generator whose gap stays beyond a bound)."""

    KIND: ClassVar[str] = "rollout_evidence"
    step: int
    group_ids: list[int]
    gaps: list[float]
    tokens: list[int]
    staleness: list[int]


@dataclass(eq=False)
class Error(Message):
    """A request failed; `in_reply_to` names the kind of the message that caused it."""

    KIND: ClassVar[str] = "error"
    code: str
    message: str
    in_reply_to: str | None = None


@dataclass(eq=False)
class Shutdown(Message):
    """Stop: the receiver drains, closes its sockets and exits."""

    KIND: ClassVar[str] = "shutdown"
    reason: str


CORE_MESSAGES: dict[str, type[Message]] = {
    cls.KIND: cls
    for cls in (
        Hello,
        Challenge,
        Welcome,
        Heartbeat,
        WorkRequest,
        PromptBatch,
        Rollout,
        ScoreRequest,
        Scored,
        BatchRequest,
        TrainBatch,
        WeightsAnnounce,
        WeightsRequest,
        WeightsChunk,
        WeightsRedirect,
        StatusRequest,
        Status,
        RolloutEvidence,
        Error,
        Shutdown,
    )
}
"""The message classes of this module by KIND (`kinds.MESSAGES` adds the payload kinds)."""
