"""The generator's side of episodes: a PromptBatch played as episodes, one Rollout per group.

`EpisodePlayer` owns the environment workers (`EnvPool`) and the turn format for the life of
the generator; `rollouts` plays a batch (`grpo_stream.envs.episodes`) and packs each group's
G episodes into a Rollout whose completion i is episode i's whole trajectory after the
prompt, with its loss mask, per-turn rewards and outcome rewards (see protocols/SPEC.md).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.episodes import Episode, EpisodeRun, TurnEngine, run_episodes
from grpo_stream.envs.sandbox import EnvPool
from grpo_stream.envs.turns import TurnFormat
from grpo_stream.protocols import messages as m
from grpo_stream.sampling import Sampling


class Player(Protocol):
    """What the generator needs to play a batch as episodes (`EpisodePlayer` against an
    environment, `grpo_stream.agents.player.AgentPlayer` by a user agent)."""

    def play(self, batch: m.PromptBatch, sampling: Sampling) -> list[list[Episode]]:
        """Play `batch` as G episodes per prompt, sampled under `sampling` (the batch's,
        seeded for its lease); the episodes grouped by prompt, in prompt order."""
        ...

    def stats(self) -> dict[str, int]: ...

    def __exit__(self, *exc_info: object) -> None: ...


class EpisodePlayer:
    """Plays PromptBatches as episodes against sandboxed environments."""

    def __init__(
        self, settings: EnvSettings, engine: TurnEngine, tokenizer: Any, chat: bool
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.tokenizer = tokenizer
        self.format = TurnFormat(tokenizer, chat, settings.format)
        self.pool = EnvPool(settings)
        self.episodes = 0
        self.failed = 0
        self.truncated = 0

    def __enter__(self) -> EpisodePlayer:
        self.pool.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.pool.close()

    def play(self, batch: m.PromptBatch, sampling: Sampling) -> list[list[Episode]]:
        run = EpisodeRun.of_batch(batch, sampling)
        groups = run_episodes(
            self.engine, self.tokenizer, self.pool, self.format, self.settings, run
        )
        for eps in groups:
            self.episodes += len(eps)
            self.failed += sum(e.error is not None for e in eps)
            self.truncated += sum(e.truncated for e in eps)
        return groups

    def stats(self) -> dict[str, int]:
        """Counters for the generator's heartbeat."""
        return {"episodes": self.episodes, "episodes_failed": self.failed,
                "episodes_truncated": self.truncated}  # fmt: skip


def episode_rollout(head: m.Rollout, episodes: list[Episode]) -> m.Rollout:
    """`head` (ids, version, prompt, timing) completed with the group's episodes."""
    lengths = [len(e.token_ids) for e in episodes]
    offsets = np.zeros(len(episodes) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    turns = np.zeros(len(episodes) + 1, dtype=np.int64)
    turns[1:] = np.cumsum([len(e.turn_rewards) for e in episodes])
    head.prompt_ids = np.array(episodes[0].prompt_ids, dtype=np.int32)
    head.completion_ids = np.array([t for e in episodes for t in e.token_ids], dtype=np.int32)
    head.completion_offsets = offsets
    head.logprobs = np.array([x for e in episodes for x in e.logprobs], dtype=np.float32)
    head.texts = [" | ".join(e.texts) for e in episodes]
    head.truncated = [e.truncated for e in episodes]
    head.loss_mask = np.array([x for e in episodes for x in e.mask], dtype=np.uint8)
    head.episode_rewards = np.array([e.reward for e in episodes], dtype=np.float32)
    head.turn_rewards = np.array([r for e in episodes for r in e.turn_rewards], dtype=np.float32)
    head.turn_starts = np.array([s for e in episodes for s in e.turn_starts], dtype=np.int64)
    head.turn_offsets = turns
    head.errors = [f"episode[{i}]: {e.error}" for i, e in enumerate(episodes) if e.error]
    return head
