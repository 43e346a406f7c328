"""Token exactness of episodes: what the trainer scores is what the generator sampled.

A 3-turn episode goes generator -> Rollout -> hub group -> TrainBatch -> trainer tensors,
and the trainer's log-probs of the sampled tokens equal the generator's to 1e-5; the loss
mask covers exactly the sampled tokens. And why the trajectory is never rebuilt from text:
re-tokenizing the finished conversation gives other ids for this tokenizer.
"""

from __future__ import annotations

import numpy as np
import torch

from grpo_stream.builds.tiny import byte_symbols
from grpo_stream.config.algo import AdvantageSettings
from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.episodes import Episode, EpisodeRun, run_episodes
from grpo_stream.envs.service import episode_rollout
from grpo_stream.envs.turns import TurnFormat
from grpo_stream.hub.batches import assemble, build_batch
from grpo_stream.hub.episodes import scored_by_env
from grpo_stream.protocols import messages as m
from grpo_stream.training.batch import to_tensors
from grpo_stream.training.packing import micro_batches, sequence_logprobs


def three_turn_group(engine, make_pool, group: int = 4) -> list[Episode]:
    pool = make_pool("bad_envs:ThreeTurns")
    run = EpisodeRun(
        prompts=["guess 1-16:"], references=[{}], group_size=group, max_tokens=3,
        temperature=1.0, top_p=1.0, seed=3,
    )  # fmt: skip
    settings = EnvSettings(name=pool.settings.name)
    fmt = TurnFormat(engine.tokenizer, chat=False)
    return run_episodes(engine, engine.tokenizer, pool, fmt, settings, run)[0]


def rollout_of(episodes: list[Episode]) -> m.Rollout:
    head = m.Rollout(
        lease_id=1, group_id=9, instance="g", policy_version=0,
        prompt_ids=np.zeros(0, np.int32), completion_ids=np.zeros(0, np.int32),
        completion_offsets=np.zeros(1, np.int64), logprobs=np.zeros(0, np.float32), texts=[],
        truncated=[], gen_seconds=0.0,
        sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=3),
    )  # fmt: skip
    return episode_rollout(head, episodes)


def test_trainer_logprobs_of_a_3_turn_episode_equal_the_generators(engine, make_pool) -> None:
    episodes = three_turn_group(engine, make_pool)
    assert all(len(e.turn_starts) == 3 for e in episodes)
    rollout = rollout_of(episodes)
    rollout.episode_rewards[:] = [0.0, 1.0, 0.5, 0.2]  # a group with signal, so it trains
    got = assemble(rollout, scored_by_env(rollout), AdvantageSettings(), None)
    batch = build_batch(0, [got.group])
    t = to_tensors(batch, pad_id=engine.tokenizer.pad_token_id)
    for seq, ep in enumerate(episodes):  # the loss covers exactly the sampled tokens
        p = len(ep.prompt_ids)
        assert t.completion_mask[seq, p : p + len(ep.mask)].tolist() == [bool(x) for x in ep.mask]
        assert not t.completion_mask[seq, :p].any()
    (part,) = micro_batches(t, 4096, 64, True, "sdpa", engine.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = sequence_logprobs(engine.model, part, chunk=8, temperature=1.0)
    mask = part.completion_mask
    assert int(mask.sum()) == sum(sum(e.mask) for e in episodes)
    gap = (logp - part.old_logp).abs()[mask]
    assert float(gap.max()) < 1e-5


def test_env_positions_do_not_reach_the_loss(engine, make_pool) -> None:
    """Whatever the (undefined) behaviour log-prob of an environment token says, nothing of
    the update reads it: the TrainBatch's loss mask removes it from the trainer's mask."""
    rollout = rollout_of(three_turn_group(engine, make_pool, group=2))
    env_tokens = rollout.loss_mask == 0
    assert env_tokens.any()
    rollout.logprobs[env_tokens] = -1e9
    rollout.episode_rewards[:] = [0.0, 1.0]
    got = assemble(rollout, scored_by_env(rollout), AdvantageSettings(), None)
    t = to_tensors(build_batch(0, [got.group]), pad_id=0)
    assert float(t.old_logp[t.completion_mask].min()) > -1e8


def test_retokenizing_the_conversation_gives_other_ids(engine, make_pool) -> None:
    """The conversation as text (prompt, each reply's text, each observation) encodes to
    other ids than the trajectory for this byte-level tokenizer: a reply's text drops the
    <eos> the policy sampled to end its turn, so every later token shifts; and a sampled
    byte that is not valid UTF-8 on its own decodes to U+FFFD, which encodes to three other
    bytes (a BPE tokenizer can also merge across a turn boundary or split differently)."""
    tok = engine.tokenizer
    for ep in three_turn_group(engine, make_pool, group=2):
        trajectory = ep.prompt_ids + ep.token_ids
        observations = [f"t{k}:" for k in (1, 2)]
        text = "guess 1-16:" + "".join(
            reply + obs for reply, obs in zip(ep.texts, [*observations, ""], strict=True)
        )
        assert tok(text)["input_ids"] != trajectory
        sampled = [t for t, keep in zip(ep.token_ids, ep.mask, strict=True) if keep]
        assert tok.eos_token_id in sampled  # the policy ended a turn with <eos>
    lone = tok.convert_tokens_to_ids(byte_symbols()[0xC3])  # half of a UTF-8 character
    assert tok(tok.decode([lone]), add_special_tokens=False)["input_ids"] != [lone]
