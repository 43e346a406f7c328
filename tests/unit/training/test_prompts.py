"""Shared-prompt micro-batches: grouping by prompt tokens, the plan, the layout, and the
trainer's gradients equal to the padded computation's (float32 and float64), as rows and on
the prompts' KV cache; wide groups run on the cache."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from grpo_stream.hub.batches import build_batch
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.messages import SamplingParams, TrainBatch
from grpo_stream.training.batch import Tensors, to_tensors
from grpo_stream.training.prompts import (
    plan,
    prompt_groups,
    prompt_splits,
    shared_batch,
    shared_micro_batches,
)

sys.path.insert(0, str(Path(__file__).parent))  # trainstates
from trainstates import grads, random_group, rel_diff, state_for

MAX_TOKENS = 30
PADDED = ["trainer.packing=false", "trainer.micro_batch=1000", "trainer.share_prompts=false"]
"""The reference: one padded micro-batch holding the whole batch, each prompt run per row."""
SHARED = ["trainer.micro_batch_tokens=120", "trainer.micro_batch=6", "algo.loss.logprob_chunk=3"]
"""Shared prompts, several micro-batches (groups split), a few sequences per forward."""


def _group(gid: int, rng: np.random.Generator, prompt: np.ndarray | None = None) -> Group:
    lengths = rng.integers(0, MAX_TOKENS, size=4)  # uneven completions, an empty one possible
    lengths[0] = max(int(lengths[0]), 1)
    sampling = SamplingParams(temperature=0.8, top_p=1.0, max_tokens=MAX_TOKENS)
    return random_group(gid, rng, lengths, (2, 9) if prompt is None else prompt, sampling=sampling)


def _batch(groups: int = 5, seed: int = 0) -> TrainBatch:
    rng = np.random.default_rng(seed)
    return build_batch(1, [_group(g, rng) for g in range(groups)])


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # the machine is shared: more threads only contend


def _state(run_dir: Path, overrides: list[str]) -> Any:
    return state_for(run_dir, f"generator.max_tokens={MAX_TOKENS}", *overrides)


def _tensors(batch: TrainBatch) -> Tensors:
    return to_tensors(batch, pad_id=0)


# ---- grouping and the plan ------------------------------------------------------------------


def test_sequences_group_by_identical_prompt_tokens_not_by_group_id() -> None:
    rng = np.random.default_rng(3)
    same = np.array([4, 5, 6], dtype=np.int32)
    groups = [_group(0, rng, same), _group(1, rng), _group(2, rng, same)]
    t = _tensors(build_batch(1, groups))
    found = prompt_groups(t, prompt_splits(t))
    assert found == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7]]


def test_prompt_split_is_the_first_completion_token() -> None:
    t = _tensors(_batch())
    splits = prompt_splits(t)
    for i, split in enumerate(splits):
        assert not bool(t.completion_mask[i, :split].any())
        if bool(t.completion_mask[i].any()):
            assert bool(t.completion_mask[i, split])


def test_plan_keeps_micro_batches_within_budget_and_holds_every_sequence_once() -> None:
    t = _tensors(_batch(groups=12, seed=1))
    splits = prompt_splits(t)
    lengths = [int(v) for v in t.attention_mask.sum(dim=1).tolist()]
    batches = plan(prompt_groups(t, splits), splits, lengths, budget=300, max_seqs=10)
    seen = sorted(i for b in batches for piece in b for i in piece)
    assert seen == list(range(t.size))
    assert any(len(b) > 1 for b in batches)  # several prompts share a micro-batch
    for pieces in batches:
        wide_p = max(splits[p[0]] for p in pieces)
        wide_c = max(lengths[i] - splits[i] for p in pieces for i in p)
        seqs = sum(len(p) for p in pieces)
        assert len(pieces) * wide_p + seqs * wide_c <= 300 and seqs <= 10


def test_a_sequence_longer_than_the_budget_names_the_setting() -> None:
    t = _tensors(_batch())
    splits = prompt_splits(t)
    lengths = [int(v) for v in t.attention_mask.sum(dim=1).tolist()]
    with pytest.raises(ValueError, match=r"trainer\.micro_batch_tokens=10"):
        plan(prompt_groups(t, splits), splits, lengths, budget=10, max_seqs=8)


def test_no_repeated_prompt_shares_nothing() -> None:
    rng = np.random.default_rng(0)
    lone = [_group(g, rng) for g in range(3)]
    for g in lone:  # one completion per group
        g.completion_offsets = g.completion_offsets[:2]
        n = int(g.completion_offsets[-1])
        g.completion_ids, g.logprobs = g.completion_ids[:n], g.logprobs[:n]
        g.rewards, g.advantages, g.valid = g.rewards[:1], g.advantages[:1], g.valid[:1]
    assert shared_micro_batches(_tensors(build_batch(1, lone)), 1000, 64, 0) is None


def test_shared_layout_rebuilds_every_sequence() -> None:
    t = _tensors(_batch())
    splits = prompt_splits(t)
    part = shared_batch(t, prompt_groups(t, splits), splits, pad_id=0)
    sp = part.prompts
    assert sp is not None and sp.prompt_ids.shape[0] == 5
    for s in range(part.size):
        n = int(part.attention_mask[s].sum())
        plen = int(sp.prompt_mask[sp.prompt_of[s]].sum())
        clen = int(sp.completion_attn[s].sum())
        prompt = sp.prompt_ids[sp.prompt_of[s], :plen]
        rebuilt = torch.cat([prompt, sp.completion_ids[s, :clen]])
        assert plen + clen == n and torch.equal(rebuilt, part.input_ids[s, :n])


# ---- the trainer ----------------------------------------------------------------------------


ROWS = {True: "trainer.prompt_rows=true", False: "trainer.prompt_rows=false"}
"""Shared prompts as rows (one forward, a 4D mask) or on the prompts' KV cache."""


@pytest.mark.parametrize("rows", [True, False])
def test_shared_gradients_equal_padded_in_float32(tmp_path: Path, rows: bool) -> None:
    batch = _batch()
    shared = _state(tmp_path / "a", [*SHARED, ROWS[rows]])
    parts = shared._micro_batches(_tensors(batch))
    assert len(parts) > 2 and all(p.prompts is not None for p in parts)
    assert all(p.prompts is not None and p.prompts.rows == rows for p in parts)
    assert shared.layout == ("rows" if rows else "shared")
    diff = rel_diff(grads(shared, batch), grads(_state(tmp_path / "b", PADDED), batch))
    assert diff <= 1e-5


@pytest.mark.parametrize("rows", [True, False])
def test_shared_gradients_equal_padded_in_float64_with_kl(tmp_path: Path, rows: bool) -> None:
    over = ["algo.loss.beta=0.1"]  # the reference model's log-probs share prompts too
    modes = ([*SHARED, ROWS[rows]], PADDED)
    states = [_state(tmp_path / str(i), over + mode) for i, mode in enumerate(modes)]
    for s in states:
        s.model.double()
        s.ref_model.double()
    batch = _batch()
    # The float64 logits agree to the last bit or so (3e-17 measured); log-probs are float32
    # from the logits on, and that cast can round a logit one float32 ulp (6e-8) apart.
    assert rel_diff(grads(states[0], batch), grads(states[1], batch)) <= 1e-7


def test_gradient_checkpointing_falls_back_to_packing(tmp_path: Path) -> None:
    state = _state(tmp_path, ["trainer.gradient_checkpointing=true"])
    parts = state._micro_batches(_tensors(_batch()))
    assert all(p.prompts is None and p.packing is not None for p in parts)


def test_groups_too_wide_for_rows_run_on_the_prompts_cache(tmp_path: Path) -> None:
    state = _state(tmp_path, SHARED)
    assert state.rows_ok
    t = _tensors(_batch())
    assert state._micro_batches(t) and state.layout == "rows"
    config = state.model.config  # rows_width reads the sizes from the config: make every row
    config.hidden_size = config.intermediate_size = 1  # too wide, 2W / (4 + 3) > 0.25
    parts = state._micro_batches(t)
    assert all(p.prompts is not None and not p.prompts.rows for p in parts)
    assert state.layout == "shared"
