"""What the trainer makes of a group of episodes, for the token-exactness tests of envs and
agents: the group as the generator's Rollout, then the hub's TrainBatch and the trainer's
tensors and log-probs of it."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from grpo_stream.config.algo import AdvantageSettings
from grpo_stream.envs.episodes import Episode
from grpo_stream.envs.service import episode_rollout
from grpo_stream.hub.batches import assemble, build_batch
from grpo_stream.hub.episodes import scored_by_env
from grpo_stream.protocols import messages as m
from grpo_stream.training.batch import to_tensors
from grpo_stream.training.packing import micro_batches, sequence_logprobs


def rollout_of(episodes: list[Episode], max_tokens: int) -> m.Rollout:
    """The generator's Rollout of one group of episodes (ids and timing made up)."""
    empty = np.zeros(0, np.int32)
    head = m.Rollout(
        lease_id=1,
        group_id=9,
        instance="g",
        policy_version=0,
        prompt_ids=empty,
        completion_ids=empty,
        completion_offsets=np.zeros(1, np.int64),
        logprobs=np.zeros(0, np.float32),
        texts=[],
        truncated=[],
        gen_seconds=0.0,
        sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=max_tokens),
    )
    return episode_rollout(head, episodes)


def check_trainer_logprobs(
    engine: Any, episodes: list[Episode], rollout: m.Rollout, tolerance: float
) -> None:
    """`rollout` (of `episodes`, rewards with signal) through the hub and the trainer: the
    loss covers exactly the sampled tokens (some), and the trainer's log-probs of them are
    the generator's to `tolerance`."""
    got = assemble(rollout, scored_by_env(rollout), AdvantageSettings(), None)
    t = to_tensors(build_batch(0, [got.group]), pad_id=engine.tokenizer.pad_token_id)
    for seq, ep in enumerate(episodes):
        p = len(ep.prompt_ids)
        assert t.completion_mask[seq, p : p + len(ep.mask)].tolist() == [bool(x) for x in ep.mask]
        assert not t.completion_mask[seq, :p].any()
    (part,) = micro_batches(t, 8192, 64, True, "sdpa", engine.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = sequence_logprobs(engine.model, part, chunk=8, temperature=1.0)
    mask = part.completion_mask
    assert int(mask.sum()) == sum(sum(e.mask) for e in episodes) > 0
    assert float((logp - part.old_logp).abs()[mask].max()) < tolerance
