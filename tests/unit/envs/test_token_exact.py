"""Token exactness of episodes: what the trainer scores is what the generator sampled.

A 3-turn episode goes generator -> Rollout -> hub group -> TrainBatch -> trainer tensors,
and the trainer's log-probs of the sampled tokens equal the generator's to 1e-5; the loss
mask covers exactly the sampled tokens. And why the trajectory is never rebuilt from text:
re-tokenizing the finished conversation gives other ids for this tokenizer.
"""

from __future__ import annotations

from grpo_stream.builds.tiny import byte_symbols
from grpo_stream.config.algo import AdvantageSettings
from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.episodes import Episode, EpisodeRun, run_episodes
from grpo_stream.envs.turns import TurnFormat
from grpo_stream.hub.batches import assemble, build_batch
from grpo_stream.hub.episodes import scored_by_env
from grpo_stream.sampling import Sampling
from grpo_stream.training.batch import to_tensors

from .trained import check_trainer_logprobs, rollout_of

MAX_TOKENS = 3


def three_turn_group(engine, make_pool, group: int = 4) -> list[Episode]:
    pool = make_pool("bad_envs:ThreeTurns")
    run = EpisodeRun(
        prompts=["guess 1-16:"],
        references=[{}],
        group_size=group,
        sampling=Sampling(MAX_TOKENS, seed=3),
    )
    settings = EnvSettings(name=pool.settings.name)
    fmt = TurnFormat(engine.tokenizer, chat=False)
    return run_episodes(engine, engine.tokenizer, pool, fmt, settings, run)[0]


def test_trainer_logprobs_of_a_3_turn_episode_equal_the_generators(engine, make_pool) -> None:
    episodes = three_turn_group(engine, make_pool)
    assert all(len(e.turn_starts) == 3 for e in episodes)
    rollout = rollout_of(episodes, MAX_TOKENS)
    rollout.episode_rewards[:] = [0.0, 1.0, 0.5, 0.2]  # a group with signal, so it trains
    check_trainer_logprobs(engine, episodes, rollout, tolerance=1e-5)


def test_env_positions_do_not_reach_the_loss(engine, make_pool) -> None:
    """Whatever the (undefined) behaviour log-prob of an environment token says, nothing of
    the update reads it: the TrainBatch's loss mask removes it from the trainer's mask."""
    rollout = rollout_of(three_turn_group(engine, make_pool, group=2), MAX_TOKENS)
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
