"""Wire messages of episodes recomputed by a scorer: the hub never takes an episode's
rewards from the generator that played it when the environment can be replayed
(`grpo_stream.envs.replay`).

The hub reads each episode's policy turns off its token ids (`grpo_stream.hub.transcript`)
and leases the group to a scorer like any other (`EpisodeScoreRequest`: the hub's own prompt
and reference, and the text of every policy turn the environment answered); the scorer plays
them against a fresh environment and answers with what the environment said to each
(`EpisodeScored`). The hub then checks the generator's environment turns against those
answers and trains with the scorer's rewards.

Invariants:
- `EpisodeScored` has one reward, observation and done flag per action of the request, in
  its order; an episode whose environment failed in the scorer has its error in `errors`
  (and NaN rewards from the failing action on);
- the actions are the hub's decoding of the generator's token ids, never texts a generator
  sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from grpo_stream.protocols.schema import Array, Message


@dataclass(eq=False)
class EpisodeScoreRequest(Message):
    """The hub leases one episode group to a scorer: replay its actions."""

    KIND: ClassVar[str] = "episode_score_request"
    lease_id: int
    group_id: int
    prompt: str  # the hub's task's
    reference: dict[str, Any]  # the hub's task's, never a generator's
    actions: list[str]  # A: every episode's answered policy turns, episode by episode
    action_offsets: Array  # int64 (G+1,): episode i's actions are actions[o[i]:o[i+1]]


@dataclass(eq=False)
class EpisodeScored(Message):
    """A scorer returns what the environment answered to each action of one group."""

    KIND: ClassVar[str] = "episode_scored"
    lease_id: int
    group_id: int
    rewards: Array  # float32 (A,): the reward of each action (NaN once its episode failed)
    observations: list[str]  # A: the environment's answer to each action ("" when done)
    done: list[bool]  # A: the environment ended the episode at this action
    errors: list[str]  # G: why episode i failed in the scorer ("" when it did not)


EPISODE_MESSAGES: dict[str, type[Message]] = {
    cls.KIND: cls for cls in (EpisodeScoreRequest, EpisodeScored)
}
"""The recomputed-episode kinds (with the core kinds in `kinds.MESSAGES`)."""
