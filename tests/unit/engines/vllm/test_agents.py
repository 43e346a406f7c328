"""Agent episodes on the vllm engine (needs vLLM): the endpoint serves 3-turn tool episodes
of the shipped tiny-tools model through `VLLMEngine.complete`, token-exact, behaviour
log-probs equal to a fresh hf forward of each finished trajectory.

Run on the CPU build with `LD_PRELOAD=$VIRTUAL_ENV/lib/libiomp5.so pytest -m gpu ...`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from grpo_stream.agents.player import AgentPlayer
from grpo_stream.config import GeneratorSettings, ModelSettings
from grpo_stream.config.envs import EnvSettings
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.envs.episodes import Episode, EpisodeRun
from grpo_stream.sampling import Sampling

pytestmark = pytest.mark.gpu

AGENTS = Path(__file__).parents[2] / "agents"
MODEL = "grpo-stream/tiny-tools"
TOLERANCE = 5e-2 if torch.cuda.is_available() else 1e-5


@pytest.fixture(scope="module")
def played() -> Iterator[list[Episode]]:
    pytest.importorskip("vllm")
    from grpo_stream.engines.vllm.engine import VLLMEngine

    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(AGENTS))  # the agent workers import agents_for_tests
    on_gpu = torch.cuda.is_available()
    model = ModelSettings(name_or_path=MODEL, dtype="auto" if on_gpu else "float32")
    memory = 0.2 if on_gpu else 0.1
    generator = GeneratorSettings(engine="vllm", gpu_memory_utilization=memory, vllm_block_size=32)
    engine = VLLMEngine.from_settings(
        model, generator, TransportSettings(), SecuritySettings(), max_model_len=256
    )
    settings = EnvSettings(agent="agents_for_tests:three_tool_turns", max_turns=6,
                           max_episode_tokens=200, agent_timeout_s=120.0)  # fmt: skip
    try:
        with AgentPlayer(settings, engine, engine.tokenizer, MODEL) as player:
            run = EpisodeRun(prompts=["37*48="], references=[{"answer": 1776}], group_size=4,
                           sampling=Sampling(80, seed=5))  # fmt: skip
            (episodes,) = player.play_run(run)
        yield episodes
    finally:
        engine.close()
        mp.undo()


def test_vllm_agent_episodes_play_three_turns_with_a_call(played: list[Episode]) -> None:
    assert all(ep.error is None for ep in played), [ep.error for ep in played]
    full = [ep for ep in played if ep.reward == 3.0]  # a call, then two stopped answers
    assert full and all(len(ep.turn_starts) >= 3 for ep in full)
    assert all(ep.texts[0].endswith("</tool_call>") for ep in full)


def test_vllm_agent_logprobs_equal_a_fresh_hf_forward(played: list[Episode]) -> None:
    from grpo_stream.models.loading import load_policy

    model = load_policy(MODEL, dtype="float32", trainable=False)
    worst = 0.0
    for ep in played:
        ids = torch.tensor([ep.prompt_ids + ep.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        p = len(ep.prompt_ids)
        ref = logp[p - 1 : -1].gather(-1, ids[0, p:, None])[:, 0]  # token j from position j-1
        sampled = torch.tensor(ep.mask, dtype=torch.bool)
        worst = max(worst, float((ref - torch.tensor(ep.logprobs))[sampled].abs().max()))
    print(f"max |vllm - hf| behaviour log-prob gap: {worst:.2e}")
    assert worst < TOLERANCE
