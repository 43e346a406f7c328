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
import torch

from grpo_stream.agents.inbox import Sampling
from grpo_stream.agents.player import AgentPlayer, AgentRun
from grpo_stream.config.algo import AdvantageSettings
from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.episodes import Episode
from grpo_stream.envs.service import episode_rollout
from grpo_stream.hub.batches import assemble, build_batch
from grpo_stream.hub.episodes import scored_by_env
from grpo_stream.protocols import messages as m
from grpo_stream.training.batch import to_tensors
from grpo_stream.training.packing import micro_batches, sequence_logprobs

from .conftest import HERE

MODEL = "grpo-stream/tiny-tools"
GROUP = 4


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
            run = AgentRun(prompts=["37*48="], references=[{"answer": 1776}], group_size=GROUP,
                           sampling=Sampling(1.0, 1.0, 80), seed=5)  # fmt: skip
            (episodes,) = player.play_run(run)
        yield engine, episodes
    finally:
        mp.undo()


def rollout_of(episodes: list[Episode]) -> m.Rollout:
    head = m.Rollout(
        lease_id=1, group_id=9, instance="g", policy_version=0,
        prompt_ids=np.zeros(0, np.int32), completion_ids=np.zeros(0, np.int32),
        completion_offsets=np.zeros(1, np.int64), logprobs=np.zeros(0, np.float32), texts=[],
        truncated=[], gen_seconds=0.0,
        sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=80),
    )  # fmt: skip
    return episode_rollout(head, episodes)


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
    rollout = rollout_of(episodes)
    rollout.episode_rewards[:] = np.arange(GROUP, dtype=np.float32)  # a group with signal
    got = assemble(rollout, scored_by_env(rollout), AdvantageSettings(), None)
    t = to_tensors(build_batch(0, [got.group]), pad_id=engine.tokenizer.pad_token_id)
    for seq, ep in enumerate(episodes):  # the loss covers exactly the sampled tokens
        p = len(ep.prompt_ids)
        assert t.completion_mask[seq, p : p + len(ep.mask)].tolist() == [bool(x) for x in ep.mask]
        assert not t.completion_mask[seq, :p].any()
    (part,) = micro_batches(t, 8192, 64, True, "sdpa", engine.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = sequence_logprobs(engine.model, part, chunk=8, temperature=1.0)
    mask = part.completion_mask
    assert int(mask.sum()) == sum(sum(e.mask) for e in episodes) > 0
    # float32 round-off of the cached decode vs the packed forward: most tokens < 1e-6, the
    # worst 3.3e-5 on the tiny-tools of 940 SFT steps; a token scored off its context or
    # position would be off by orders more
    assert float((logp - part.old_logp).abs()[mask].max()) < 1e-4


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
