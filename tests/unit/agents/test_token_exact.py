"""Token exactness of agent episodes: what the trainer scores is what the model sampled.

Agents (the openai client, in the agent sandbox) play 3 turns with tool calls against the
endpoint on the shipped tiny-tools model (hf engine, its KV cache kept between turns); each
episode goes generator -> Rollout -> hub group -> TrainBatch -> trainer tensors, and the
trainer's log-probs of the sampled tokens equal the generator's to 1e-4, the loss mask
covers exactly the sampled tokens, and every token between two turns is the chat
template's text for the messages the agent added (nothing re-tokenized)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from grpo_stream.agents.player import AgentPlayer
from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.episodes import Episode, EpisodeRun
from grpo_stream.sampling import Sampling

from ..envs.trained import check_trainer_logprobs, rollout_of
from .conftest import HERE

MODEL = "grpo-stream/tiny-tools"
GROUP = 4
MAX_TOKENS = 80


@pytest.fixture(scope="module")
def played() -> Iterator[tuple[Any, list[Episode]]]:
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.models.loading import load_policy, load_tokenizer

    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(HERE))  # the agent workers import agents_for_tests
    engine = HFEngine(load_policy(MODEL, dtype="float32", trainable=False), load_tokenizer(MODEL))
    settings = EnvSettings(agent="agents_for_tests:three_tool_turns", max_turns=8,
                           max_episode_tokens=220, agent_timeout_s=60.0)  # fmt: skip
    try:
        with AgentPlayer(settings, engine, engine.tokenizer, MODEL) as player:
            run = EpisodeRun(prompts=["37*48="], references=[{"answer": 1776}], group_size=GROUP,
                           sampling=Sampling(MAX_TOKENS, seed=5))  # fmt: skip
            (episodes,) = player.play_run(run)
        yield engine, episodes
    finally:
        mp.undo()


def test_episodes_played_three_turns_with_a_tool_call(played) -> None:
    """Every episode ends well (the agent's reward: its well-formed calls plus its replies
    that stopped); one at least called calc, then answered twice, in 3 turns or more."""
    _, episodes = played
    assert all(ep.error is None for ep in episodes), [ep.error for ep in episodes]
    full = [ep for ep in episodes if ep.reward == 3.0]
    assert full and all(len(ep.turn_starts) >= 3 for ep in full)
    for ep in full:
        assert ep.texts[0].endswith("</tool_call>")  # the rest of the call
        assert not any(t.startswith("<tool_call>") for t in ep.texts)  # its opening: mask 0


def test_trainer_logprobs_of_agent_episodes_equal_the_generators(played) -> None:
    engine, episodes = played
    rollout = rollout_of(episodes, MAX_TOKENS)
    rollout.episode_rewards[:] = np.arange(GROUP, dtype=np.float32)  # a group with signal
    # float32 round-off of the cached decode vs the packed forward: most tokens < 1e-6, the
    # worst 3.3e-5 on the tiny-tools of 940 SFT steps; a token scored off its context or
    # position would be off by orders more
    check_trainer_logprobs(engine, episodes, rollout, tolerance=1e-4)


def test_each_reply_is_sampled_tokens_then_template_tokens_tokenized_alone(played) -> None:
    """Between two replies only template text (the tool's answer as the template's tool
    message, the next generation prompt, a forced call's opening), mask 0, its ids those
    of its text tokenized alone; the forced opening of the first call follows the prompt."""
    engine, episodes = played
    tok = engine.tokenizer
    opening = tok("<tool_call>", add_special_tokens=False)
    for ep in episodes:
        assert ep.token_ids[: ep.turn_starts[0]] == opening["input_ids"]
        ends = [*ep.turn_starts[1:], len(ep.token_ids)]
        for start, end in zip(ep.turn_starts, ends, strict=True):
            span = ep.mask[start:end]
            sampled = span.index(0) if 0 in span else len(span)
            assert span == [1] * sampled + [0] * (len(span) - sampled)
            between = ep.token_ids[start + sampled : end]
            if end < len(ep.token_ids):
                text = tok.decode(between)
                assert text.startswith(("\nR:", "\nQ:")) and text.endswith(("A:", "A:<tool_call>"))
                assert tok(text, add_special_tokens=False)["input_ids"] == between
