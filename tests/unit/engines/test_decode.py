"""One prefill per prompt (engines.decode `repeats`): `generate` prefills each of its P prompts
once and repeats the KV cache G times, and samples what prefilling all P*G rows samples."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from grpo_stream.engines.decode import left_pad
from grpo_stream.engines.hf import HFEngine
from grpo_stream.sampling import Sampling

PROMPTS = ["1+2=", "12+34=", "7*8=?", "100-1="]  # different lengths: rows are left-padded
G = 4


def every_row_prefilled(engine: HFEngine, prompts: list[str], seed: int) -> list[Any]:
    """The path without repeats: each prompt's row given G times, all P*G rows prefilled."""
    ids = engine.tokenizer(prompts)["input_ids"]
    rows = [r for r in ids for _ in range(G)]
    return engine.sample_rows(rows, Sampling(8, seed=seed), inflight=True)


def test_generate_prefills_one_row_per_prompt(hf_engine: HFEngine) -> None:
    batch_sizes: list[int] = []

    def record(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        batch_sizes.append(int(kwargs["input_ids"].shape[0]))

    handle = hf_engine.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        hf_engine.generate(PROMPTS, group_size=G, sampling=Sampling(max_tokens=4, seed=0))
    finally:
        handle.remove()
    assert batch_sizes[0] == len(PROMPTS)  # the prefill
    assert set(batch_sizes[1:]) == {len(PROMPTS) * G}  # every decoding step: all samples


def test_one_prefill_per_prompt_samples_what_prefilling_every_row_samples(
    hf_engine: HFEngine,
) -> None:
    for seed in (0, 1, 2):
        groups = hf_engine.generate(
            PROMPTS, group_size=G, sampling=Sampling(max_tokens=8, seed=seed)
        )
        repeated = [c for g in groups for c in g.completions]
        reference = every_row_prefilled(hf_engine, PROMPTS, seed)
        assert [c.token_ids for c in repeated] == [c.token_ids for c in reference]
        for got, want in zip(repeated, reference, strict=True):
            np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
            assert got.truncated == want.truncated


def test_repeated_samples_of_a_prompt_differ(hf_engine: HFEngine) -> None:
    (group,) = hf_engine.generate(["1+2="], group_size=8, sampling=Sampling(max_tokens=8, seed=0))
    assert len({tuple(c.token_ids) for c in group.completions}) > 1


def test_repeated_cache_recomputed_after_an_inflight_swap_matches_every_row_prefilled(
    hf_engine: HFEngine,
) -> None:
    gen = torch.Generator().manual_seed(3)
    new = [
        (n, p.detach() + 0.1 * torch.randn(p.shape, generator=gen))
        for n, p in hf_engine.model.named_parameters()
    ]
    old = [(n, p.detach().clone()) for n, p in hf_engine.model.named_parameters()]

    def run(sample: Any) -> list[Any]:
        hf_engine.load_weights(old, version=0)
        calls: list[int] = []

        def between_steps() -> None:
            calls.append(1)
            if len(calls) == 3:
                hf_engine.load_weights(new, version=1)

        hf_engine.enable_inflight(between_steps, keep_kv=False)
        return list(sample())

    repeated = run(
        lambda: (
            c
            for g in hf_engine.generate(PROMPTS, G, sampling=Sampling(max_tokens=8, seed=7))
            for c in g.completions
        )
    )
    reference = run(lambda: every_row_prefilled(hf_engine, PROMPTS, seed=7))
    assert any(len(c.version_runs) == 2 for c in repeated)  # some rows span the swap
    assert [c.token_ids for c in repeated] == [c.token_ids for c in reference]
    assert [c.version_runs for c in repeated] == [c.version_runs for c in reference]
    for got, want in zip(repeated, reference, strict=True):
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)


def test_left_pad_right_aligns_each_row_after_the_pad_and_masks_only_its_tokens() -> None:
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
