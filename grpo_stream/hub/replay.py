"""The experience-replay buffer of scored groups.

Invariants:
- it never holds more than `capacity` groups; the oldest are evicted first;
- a group is handed out at most `reuse` times;
- a group the ledger calls stale (`Ledger.is_stale`: more than `max_staleness` versions
  behind the trainer) is never handed out: it is evicted and reported as stale (counted by
  the ledger).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from grpo_stream.protocols.messages import SamplingParams

IsStale = Callable[[int], bool]
"""Whether a policy version is too old to train now: `Ledger.is_stale`, the one owner."""


@dataclass
class Group:
    """One scored prompt: G completions with their tokens, behaviour log-probs and advantages."""

    group_id: int
    policy_version: int
    prompt_ids: np.ndarray  # (Tp,) int32
    completion_ids: np.ndarray  # (sum_i L_i,) int32
    completion_offsets: np.ndarray  # (G+1,) int64
    logprobs: np.ndarray  # (sum_i L_i,) float32
    rewards: np.ndarray  # (G,) float32, NaN where a reward failed
    advantages: np.ndarray  # (G,) float32, 0 where the reward failed
    valid: np.ndarray  # (G,) bool: completions that carry a reward and are trained
    sampling: SamplingParams  # how the completions were sampled (the Rollout's)
    truncated: list[bool] = field(default_factory=list)
    uses: int = 0
    loss_mask: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    """Episodes: (sum_i L_i,) uint8, 1 on sampled tokens; empty: all sampled."""
    token_advantages: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    """Per-turn returns: (sum_i L_i,) float32 per-token advantages; empty: `advantages`."""
    source: str = ""
    """hub.payloads = "direct": the payload store holding the tokens (the arrays above are
    then lengths only: empty ids and log-probs, real offsets); "" when the hub holds them."""
    digest: str = ""
    """hub.payloads = "direct": the payload's digest (`protocols.payloads.payload_digest`)."""
    distill_kl: float = float("nan")
    """Distillation: the mean reverse KL of its completions from the teacher (NaN: untaught)."""

    @property
    def size(self) -> int:
        return int(len(self.completion_offsets) - 1)

    @property
    def num_tokens(self) -> int:
        return int(self.completion_ids.shape[0])

    def to_state(self) -> dict[str, Any]:
        """A msgpack-native dict (arrays as dtype/shape/bytes) for the hub checkpoint."""
        state: dict[str, Any] = {
            "group_id": self.group_id,
            "policy_version": self.policy_version,
            "truncated": list(self.truncated),
            "uses": self.uses,
            "sampling": asdict(self.sampling),
            "source": self.source,
            "digest": self.digest,
            "distill_kl": self.distill_kl,
        }
        for name in ARRAY_FIELDS:
            arr = np.ascontiguousarray(getattr(self, name))
            state[name] = {"dtype": str(arr.dtype), "shape": list(arr.shape), "data": arr.tobytes()}
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Group:
        arrays = {
            name: np.frombuffer(state[name]["data"], dtype=state[name]["dtype"])
            .reshape(state[name]["shape"])
            .copy()
            for name in ARRAY_FIELDS
        }
        return cls(
            group_id=int(state["group_id"]),
            policy_version=int(state["policy_version"]),
            truncated=[bool(t) for t in state["truncated"]],
            uses=int(state["uses"]),
            sampling=SamplingParams(**state["sampling"]),
            source=str(state.get("source", "")),  # checkpoints from before direct payloads
            digest=str(state.get("digest", "")),
            distill_kl=float(state.get("distill_kl", float("nan"))),  # older: none
            **arrays,
        )


ARRAY_FIELDS = (
    "prompt_ids",
    "completion_ids",
    "completion_offsets",
    "logprobs",
    "rewards",
    "advantages",
    "valid",
    "loss_mask",
    "token_advantages",
)


@dataclass
class Sampled:
    """What `ReplayBuffer.sample` hands out and what it evicted on the way."""

    groups: list[Group]
    first_use: list[bool]
    stale: list[Group]


class ReplayBuffer:
    """Bounded buffer of groups with fifo / uniform / priority sampling and reuse."""

    def __init__(
        self,
        capacity: int,
        reuse: int = 1,
        sampling: Literal["fifo", "uniform", "priority"] = "fifo",
        seed: int = 0,
    ) -> None:
        self.capacity = capacity
        self.reuse = reuse
        self.sampling = sampling
        self._groups: list[Group] = []  # oldest first
        self._rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, group: Group) -> list[Group]:
        """Add a group; return the groups evicted to make room (oldest first)."""
        self._groups.append(group)
        evicted: list[Group] = []
        while len(self._groups) > self.capacity:
            evicted.append(self._groups.pop(0))
        return evicted

    def evict_stale(self, is_stale: IsStale) -> list[Group]:
        """Remove and return every group too old to train now (`is_stale`: the ledger's)."""
        keep: list[Group] = []
        stale: list[Group] = []
        for g in self._groups:
            (stale if is_stale(g.policy_version) else keep).append(g)
        self._groups = keep
        return stale

    def ready(self, is_stale: IsStale) -> int:
        """How many groups could be handed out now."""
        return sum(1 for g in self._groups if not is_stale(g.policy_version))

    def sample(self, n: int, is_stale: IsStale) -> Sampled:
        """Hand out `n` fresh groups (fewer if not enough), evicting stale ones first."""
        stale = self.evict_stale(is_stale)
        chosen = self._choose(min(n, len(self._groups)))
        first_use = []
        for g in chosen:
            first_use.append(g.uses == 0)
            g.uses += 1
        used_up = {id(g) for g in chosen if g.uses >= self.reuse}
        self._groups = [g for g in self._groups if id(g) not in used_up]
        return Sampled(groups=chosen, first_use=first_use, stale=stale)

    def drop(self, group_ids: set[int]) -> list[Group]:
        """Take these groups out (their payloads are gone); returns the ones it held."""
        gone = [g for g in self._groups if g.group_id in group_ids]
        self._groups = [g for g in self._groups if g.group_id not in group_ids]
        return gone

    def mark_used(self, group_ids: list[int]) -> None:
        """Count one more use of each group (a send the checkpoint missed, from the journal)."""
        wanted = set(group_ids)
        for g in self._groups:
            if g.group_id in wanted:
                g.uses += 1
        self._groups = [g for g in self._groups if g.uses < self.reuse]

    def _choose(self, n: int) -> list[Group]:
        if n <= 0:
            return []
        if self.sampling == "fifo":
            return self._groups[:n]
        if self.sampling == "uniform":
            return self._rng.sample(self._groups, n)
        # priority: mean |advantage| of the valid completions, highest first (ties: oldest).
        scored = sorted(
            enumerate(self._groups),
            key=lambda item: (-_priority(item[1]), item[0]),
        )
        return [g for _, g in scored[:n]]

    def groups(self) -> Iterable[Group]:
        return iter(self._groups)

    def state(self) -> list[dict[str, Any]]:
        return [g.to_state() for g in self._groups]

    def load_state(self, state: list[dict[str, Any]]) -> None:
        self._groups = [Group.from_state(s) for s in state]


def _priority(group: Group) -> float:
    adv = np.abs(group.advantages[group.valid])
    return float(adv.mean()) if adv.size else 0.0
