"""The hf engine on a real tiny Qwen2 model on the CPU."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from grpo_stream.engines import Engine
from grpo_stream.engines.hf import HFEngine
from grpo_stream.sampling import GroupSample, Sampling

sys.path.insert(0, str(Path(__file__).parent / "reference"))  # not engines/: vllm/ there
# would import as `vllm` where vLLM is not installed
from teacher_forced import teacher_forced_logprobs

PROMPTS = ["1+2=", "12+34=", "7*8=?", "100-1="]


def all_completions(groups: list[GroupSample]) -> list[Any]:
    return [c for g in groups for c in g.completions]


@contextmanager
def biased_logit(engine: HFEngine, token_id: int, bias: float) -> Iterator[None]:
    """Add `bias` to one token's logit at the model's output (a real model, nudged)."""

    def hook(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[..., token_id] += bias
        return output

    handle = engine.model.lm_head.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def perturbed(model: Any, scale: float) -> list[tuple[str, np.ndarray]]:
    gen = torch.Generator().manual_seed(1)
    return [
        (name, (p.detach() + scale * torch.randn(p.shape, generator=gen)).numpy())
        for name, p in model.named_parameters()
    ]


def test_hf_engine_satisfies_engine_protocol(hf_engine: HFEngine) -> None:
    assert isinstance(hf_engine, Engine)


def test_generate_returns_group_size_completions_per_prompt_in_order(
    hf_engine: HFEngine, tokenizer: Any
) -> None:
    groups = hf_engine.generate(PROMPTS, group_size=3, sampling=Sampling(max_tokens=5, seed=0))
    assert len(groups) == len(PROMPTS)
    for prompt, group in zip(PROMPTS, groups, strict=True):
        assert group.prompt_ids == tokenizer(prompt)["input_ids"]
        assert len(group.completions) == 3
        for c in group.completions:
            assert 1 <= len(c.token_ids) <= 5
            assert len(c.logprobs) == len(c.token_ids)
            assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)


def test_completion_ends_at_first_eos_or_has_exactly_max_tokens(
    hf_engine: HFEngine, tokenizer: Any
) -> None:
    groups = hf_engine.generate(PROMPTS * 4, group_size=8, sampling=Sampling(max_tokens=8, seed=3))
    eos = tokenizer.eos_token_id
    completions = all_completions(groups)
    assert any(eos in c.token_ids for c in completions), "the seeded sample should hit <eos>"
    for c in completions:
        if eos in c.token_ids:
            assert c.token_ids.index(eos) == len(c.token_ids) - 1
            assert not c.truncated
        else:
            assert len(c.token_ids) == 8
            assert c.truncated


def test_sampled_eos_ends_the_completion_and_is_kept(hf_engine: HFEngine, tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    with biased_logit(hf_engine, eos, 100.0):
        groups = hf_engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=6, seed=0))
    for c in all_completions(groups):
        assert c.token_ids == [eos]
        assert c.text == ""
        assert c.truncated is False
        assert c.logprobs[0] == pytest.approx(0.0, abs=1e-4)


def test_completion_without_eos_at_max_tokens_is_truncated(
    hf_engine: HFEngine, tokenizer: Any
) -> None:
    with biased_logit(hf_engine, tokenizer.eos_token_id, -1e4):
        groups = hf_engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=6, seed=0))
    for c in all_completions(groups):
        assert len(c.token_ids) == 6
        assert c.truncated is True


def test_same_seed_gives_identical_samples(hf_engine: HFEngine) -> None:
    first = hf_engine.generate(PROMPTS, group_size=4, sampling=Sampling(max_tokens=6, seed=11))
    second = hf_engine.generate(PROMPTS, group_size=4, sampling=Sampling(max_tokens=6, seed=11))
    assert first == second


def test_different_seeds_give_different_samples(hf_engine: HFEngine) -> None:
    first = hf_engine.generate(PROMPTS, group_size=4, sampling=Sampling(max_tokens=6, seed=11))
    second = hf_engine.generate(PROMPTS, group_size=4, sampling=Sampling(max_tokens=6, seed=12))
    tokens = [c.token_ids for c in all_completions(first)]
    assert tokens != [c.token_ids for c in all_completions(second)]


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_logprobs_match_teacher_forced_forward_of_unpadded_sequence(
    hf_engine: HFEngine, temperature: float
) -> None:
    # Prompts of different lengths, so most rows were left-padded during generation.
    groups = hf_engine.generate(
        PROMPTS, group_size=4, sampling=Sampling(max_tokens=8, temperature=temperature, seed=5)
    )
    worst = 0.0
    for group in groups:
        for c in group.completions:
            expected = teacher_forced_logprobs(
                hf_engine.model, group.prompt_ids, c.token_ids, temperature
            )
            worst = max(worst, float(np.max(np.abs(np.array(expected) - c.logprobs))))
    assert worst < 1e-4


def test_tiny_top_p_samples_the_most_likely_token(hf_engine: HFEngine) -> None:
    groups = hf_engine.generate(
        PROMPTS, group_size=2, sampling=Sampling(max_tokens=4, top_p=1e-6, seed=0)
    )
    for group in groups:
        for c in group.completions:
            ids = torch.tensor([group.prompt_ids + c.token_ids])
            with torch.no_grad():
                logits = hf_engine.model(input_ids=ids).logits[0]
            start = len(group.prompt_ids) - 1
            greedy = logits[start : start + len(c.token_ids)].argmax(-1).tolist()
            assert c.token_ids == greedy


def test_load_weights_changes_logprobs_and_sets_version(hf_engine: HFEngine) -> None:
    before = hf_engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=4, seed=0))
    hf_engine.load_weights(perturbed(hf_engine.model, 0.05), version=7)
    after = hf_engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=4, seed=0))
    assert hf_engine.version == 7
    first = [c.logprobs[0] for c in all_completions(before)]
    assert first != [c.logprobs[0] for c in all_completions(after)]


def test_load_weights_writes_the_sent_values_into_the_model(hf_engine: HFEngine) -> None:
    named = perturbed(hf_engine.model, 0.05)
    hf_engine.load_weights(named, version=1)
    params = dict(hf_engine.model.named_parameters())
    for name, value in named:
        assert torch.equal(params[name].detach(), torch.from_numpy(value))


def test_load_weights_accepts_bfloat16_numpy_arrays(hf_engine: HFEngine) -> None:
    import ml_dtypes

    named = [(n, v.astype(ml_dtypes.bfloat16)) for n, v in perturbed(hf_engine.model, 0.05)]
    hf_engine.load_weights(named, version=2)
    params = dict(hf_engine.model.named_parameters())
    for name, value in named:
        assert np.array_equal(params[name].detach().numpy(), value.astype(np.float32))


def test_load_weights_accepts_the_tied_lm_head_alias(hf_engine: HFEngine) -> None:
    named = perturbed(hf_engine.model, 0.05)
    embed = dict(named)["model.embed_tokens.weight"]
    hf_engine.load_weights([*named, ("lm_head.weight", embed)], version=3)
    assert torch.equal(hf_engine.model.lm_head.weight.detach(), torch.from_numpy(embed))


def test_incomplete_weights_version_is_rejected_and_model_unchanged(
    hf_engine: HFEngine,
) -> None:
    snapshot = {n: p.detach().clone() for n, p in hf_engine.model.named_parameters()}
    named = perturbed(hf_engine.model, 0.05)
    with pytest.raises(ValueError, match="incomplete"):
        hf_engine.load_weights(named[:-1], version=5)
    assert hf_engine.version == 0
    for name, param in hf_engine.model.named_parameters():
        assert torch.equal(param.detach(), snapshot[name])


def test_weights_with_wrong_shape_are_rejected(hf_engine: HFEngine) -> None:
    named = perturbed(hf_engine.model, 0.05)
    named[0] = (named[0][0], np.zeros((3, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        hf_engine.load_weights(named, version=5)


def test_weights_with_unknown_name_are_rejected(hf_engine: HFEngine) -> None:
    named = [*perturbed(hf_engine.model, 0.05), ("not.a.param", np.zeros(2, np.float32))]
    with pytest.raises(ValueError, match=r"unknown tensor 'not\.a\.param'"):
        hf_engine.load_weights(named, version=5)


def test_prompt_that_encodes_to_no_tokens_is_rejected(hf_engine: HFEngine) -> None:
    with pytest.raises(ValueError, match="no tokens"):
        hf_engine.generate(["1+1=", ""], group_size=2, sampling=Sampling(max_tokens=4))
