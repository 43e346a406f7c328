"""Episodes on the vllm engine (needs vLLM): `VLLMEngine.complete` plays a 3-turn episode
through the generator's `EpisodePlayer` (sandboxed environment workers) on the shipped
tiny-guess model, token-exact, with behaviour log-probs equal to a fresh hf forward of the
finished trajectory, and vLLM's prefix cache reusing each episode's earlier turns.

Run on the CPU build with `LD_PRELOAD=$VIRTUAL_ENV/lib/libiomp5.so pytest -m gpu ...`.
vLLM starts once for this module (about 35 s on the CPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from grpo_stream.config import GeneratorSettings, ModelSettings
from grpo_stream.config.envs import EnvSettings
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.envs.episodes import Episode
from grpo_stream.protocols import messages as m
from grpo_stream.sampling import Completion, Sampling

pytestmark = pytest.mark.gpu

HERE = Path(__file__).parent
MODEL = "grpo-stream/tiny-guess"
BLOCK = 32  # the CPU backend's smallest block size
# Longer than one block, so turn 1 already leaves a full block for turn 2 to reuse.
PROMPT = "the number is hidden between one and sixteen. guess 1-16:"
GROUP = 4
MAX_TOKENS = 4
TOLERANCE = 5e-2 if torch.cuda.is_available() else 1e-5  # CPU fp32: 9.5e-7 measured


@pytest.fixture(scope="module")
def vllm_engine() -> Iterator[Any]:
    pytest.importorskip("vllm")
    from grpo_stream.engines.vllm.engine import VLLMEngine

    on_gpu = torch.cuda.is_available()
    engine = VLLMEngine.from_settings(
        ModelSettings(name_or_path=MODEL, dtype="auto" if on_gpu else "float32"),
        GeneratorSettings(
            engine="vllm", gpu_memory_utilization=0.2 if on_gpu else 0.05, vllm_block_size=BLOCK
        ),
        TransportSettings(),
        SecuritySettings(),
        max_model_len=128,
    )
    yield engine
    engine.close()


@dataclass
class Recorder:
    """The engine as the turn loop sees it, with each call's rows, replies and cache hits."""

    engine: Any
    calls: list[tuple[list[list[int]], list[Completion], list[int]]] = field(default_factory=list)

    def complete(self, rows: list[list[int]], sampling: Sampling) -> list[Completion]:
        got: list[Completion] = self.engine.complete(rows, sampling)
        self.calls.append(([list(r) for r in rows], got, list(self.engine.last_cached_tokens)))
        return got


@pytest.fixture(scope="module")
def played(vllm_engine: Any) -> tuple[Recorder, list[Episode]]:
    from grpo_stream.envs.service import EpisodePlayer

    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(HERE))  # the environment workers import vllm_envs
    settings = EnvSettings(name="vllm_envs:ThreeTurns", max_turns=3, max_episode_tokens=64)
    recorder = Recorder(vllm_engine)
    vllm_engine.reset_prefix_cache()  # nothing cached from earlier tests
    batch = m.PromptBatch(
        lease_id=1, group_ids=np.array([0], np.int64), prompts=[PROMPT], references=[{}],
        group_size=GROUP, min_version=0,
        sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS),
    )  # fmt: skip
    try:
        with EpisodePlayer(settings, recorder, vllm_engine.tokenizer, chat=False) as player:
            (episodes,) = player.play(batch, Sampling.of(batch.sampling, seed=11))
    finally:
        mp.undo()
    return recorder, episodes


def test_vllm_episode_trajectory_is_sampled_ids_plus_tokenized_observations(
    played: tuple[Recorder, list[Episode]], vllm_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    from vllm_envs import REWARDS, observation

    recorder, episodes = played
    tok = vllm_engine.tokenizer
    assert len(recorder.calls) == 3
    for i, ep in enumerate(episodes):
        assert ep.error is None and not ep.truncated
        assert ep.reward == pytest.approx(sum(REWARDS))
        ids: list[int] = []
        mask: list[int] = []
        for turn, (rows, replies, _) in enumerate(recorder.calls):
            assert rows[i] == ep.prompt_ids + ids  # each turn continues the exact ids
            ids += replies[i].token_ids
            mask += [1] * len(replies[i].token_ids)
            if turn < 2:
                env = tok(observation(turn + 1), add_special_tokens=False)["input_ids"]
                ids += env
                mask += [0] * len(env)
        assert ep.token_ids == ids
        assert ep.mask == mask


def test_vllm_episode_logprobs_equal_a_fresh_hf_forward_of_the_trajectory(
    played: tuple[Recorder, list[Episode]],
) -> None:
    from grpo_stream.models.loading import load_policy

    _, episodes = played
    model = load_policy(MODEL, dtype="float32", trainable=False)
    worst = 0.0
    for ep in episodes:
        ids = torch.tensor([ep.prompt_ids + ep.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)  # T=1
        p = len(ep.prompt_ids)
        ref = logp[p - 1 : -1].gather(-1, ids[0, p:, None])[:, 0]  # token j from position j-1
        sampled = torch.tensor(ep.mask, dtype=torch.bool)
        gap = (ref - torch.tensor(ep.logprobs))[sampled].abs()
        worst = max(worst, float(gap.max()))
    print(f"max |vllm - hf| behaviour log-prob gap: {worst:.2e}")
    assert worst < TOLERANCE


def test_vllm_turns_after_the_first_reuse_their_episodes_cached_prefix(
    played: tuple[Recorder, list[Episode]],
) -> None:
    """Each row of turn 2 and 3 is served from the cache at least as far as the full blocks
    that earlier turns computed for it (a turn computes its row and all but its last sampled
    token); on turn 3 that reaches past the prompt, into the episode's own tokens."""
    recorder, _ = played
    computed: list[list[int]] = []
    for turn, (rows, replies, cached) in enumerate(recorder.calls):
        print(f"turn {turn + 1}: rows {[len(r) for r in rows]} cached {cached}")
        if turn > 0:
            for row, hit in zip(rows, cached, strict=True):
                reusable = max(_common(row[:-1], seq) for seq in computed)
                assert hit >= reusable // BLOCK * BLOCK
                assert hit % BLOCK == 0 and hit < len(row)
        if turn == 2:
            assert min(cached) >= 2 * BLOCK > len(recorder.calls[0][0][0])
        computed += [row + c.token_ids[:-1] for row, c in zip(rows, replies, strict=True)]


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_vllm_weight_update_empties_the_prefix_cache(vllm_engine: Any) -> None:
    from grpo_stream.models.loading import load_policy

    row = vllm_engine.tokenizer(PROMPT)["input_ids"] * 2  # 2 full blocks and a bit
    vllm_engine.complete([row], Sampling(2, seed=0))
    vllm_engine.complete([row], Sampling(2, seed=0))
    warm = vllm_engine.last_cached_tokens
    model = load_policy(MODEL, dtype="float32", trainable=False)
    vllm_engine.load_weights(model.named_parameters(), version=3)
    vllm_engine.complete([row], Sampling(2, seed=0))
    assert warm == [(len(row) - 1) // BLOCK * BLOCK] and vllm_engine.last_cached_tokens == [0]


def test_vllm_complete_with_a_seed_is_deterministic(vllm_engine: Any) -> None:
    rows = [vllm_engine.tokenizer(PROMPT)["input_ids"], [1, 107, 121]]
    first = vllm_engine.complete(rows, Sampling(4, seed=5))
    second = vllm_engine.complete(rows, Sampling(4, seed=5))
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert all(len(c.logprobs) == len(c.token_ids) >= 1 for c in first)
