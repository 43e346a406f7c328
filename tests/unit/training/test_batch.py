"""TrainBatch to padded tensors: alignment of tokens, masks and behaviour log-probs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_stream.hub.batches import build_batch, build_step, offline_stats
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.messages import SamplingParams
from grpo_stream.training.batch import to_tensors


def _group() -> Group:
    return Group(
        group_id=3,
        policy_version=1,
        prompt_ids=np.array([7, 8], np.int32),
        completion_ids=np.array([1, 2, 3, 4, 5, 6], np.int32),
        completion_offsets=np.array([0, 3, 3, 6], np.int64),  # second completion is empty
        logprobs=np.array([-0.1, -0.2, -0.3, -0.4, -0.5, -0.6], np.float32),
        rewards=np.array([1.0, 0.0, np.nan], np.float32),
        advantages=np.array([0.7, -0.7, 0.0], np.float32),
        valid=np.array([True, True, False]),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
    )


def test_only_valid_nonempty_completions_become_sequences() -> None:
    batch = build_batch(0, [_group()])
    assert batch.seq_offsets.tolist() == [0, 5]
    assert batch.input_ids.tolist() == [7, 8, 1, 2, 3]
    assert batch.advantages.tolist() == pytest.approx([0.7])
    assert (batch.totals.num_seqs, batch.totals.num_tokens) == (1, 3)


def test_tensors_align_logprobs_with_completion_positions() -> None:
    g = _group()
    g.valid[:] = True
    g.rewards[:] = [1.0, 0.0, 0.5]
    t = to_tensors(build_batch(0, [g]), pad_id=0)
    assert t.input_ids.tolist() == [[7, 8, 1, 2, 3], [7, 8, 4, 5, 6]]
    assert t.completion_mask.tolist() == [[False, False, True, True, True]] * 2
    assert torch.allclose(t.old_logp[1, 2:], torch.tensor([-0.4, -0.5, -0.6]))
    assert float(t.old_logp[:, :2].abs().sum()) == 0.0


def test_slice_trims_padding_to_the_longest_row() -> None:
    g = _group()
    g.valid[:] = True
    g.completion_offsets = np.array([0, 1, 1, 6], np.int64)
    t = to_tensors(build_batch(0, [g]), pad_id=0)
    assert t.input_ids.shape == (2, 7)
    assert t.slice(0, 1).input_ids.shape == (1, 3)


def test_logprob_count_mismatch_is_an_error() -> None:
    batch = build_batch(0, [_group()])
    batch.behaviour_logprobs = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="behaviour log-probs"):
        to_tensors(batch, pad_id=0)


def test_every_shard_carries_the_whole_steps_totals() -> None:
    a, b = _group(), _group()
    b.valid[:] = True  # 2 sequences of 3 tokens (the empty one is left out) vs 1 of 3
    shards = build_step(0, [a, b], offline_stats([a, b]), world=2)
    assert [len(s.advantages) for s in shards] == [1, 2]
    assert all((s.totals.num_seqs, s.totals.num_tokens) == (3, 9) for s in shards)


def test_groups_sampled_differently_cannot_share_a_step() -> None:
    a, b = _group(), _group()
    b.sampling = SamplingParams(temperature=0.7, top_p=1.0, max_tokens=8)
    with pytest.raises(ValueError, match="sampled differently"):
        build_batch(0, [a, b])


def test_the_batch_carries_its_groups_sampling() -> None:
    g = _group()
    g.sampling = SamplingParams(temperature=0.7, top_p=1.0, max_tokens=5)
    assert build_batch(0, [g]).sampling == g.sampling


def _ragged(gid: int, prompt: list[int], completions: list[list[int]]) -> Group:
    flat = [t for c in completions for t in c]
    offsets = np.cumsum([0] + [len(c) for c in completions]).astype(np.int64)
    k = len(completions)
    return Group(
        group_id=gid,
        policy_version=1,
        prompt_ids=np.array(prompt, np.int32),
        completion_ids=np.array(flat, np.int32),
        completion_offsets=offsets,
        logprobs=-np.array(flat, np.float32) / 10,  # token t's log-prob: -t/10
        rewards=np.arange(k, dtype=np.float32),
        advantages=np.linspace(-1, 1, k).astype(np.float32),
        valid=np.ones(k, bool),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
    )


def test_rows_of_different_prompt_and_completion_lengths_land_in_their_columns() -> None:
    groups = [_ragged(1, [7, 8], [[1, 2, 3], [4]]), _ragged(2, [9], [[5, 6], [2]])]
    t = to_tensors(build_batch(0, groups), pad_id=0)
    assert t.input_ids.tolist() == [
        [7, 8, 1, 2, 3],
        [7, 8, 4, 0, 0],
        [9, 5, 6, 0, 0],
        [9, 2, 0, 0, 0],
    ]
    assert t.attention_mask.tolist() == [
        [1] * 5,
        [1] * 3 + [0] * 2,
        [1] * 3 + [0] * 2,
        [1] * 2 + [0] * 3,
    ]
    assert t.completion_mask.int().tolist() == [
        [0, 0, 1, 1, 1],
        [0, 0, 1, 0, 0],
        [0, 1, 1, 0, 0],
        [0, 1, 0, 0, 0],
    ]
    expected = torch.where(t.completion_mask, -t.input_ids.float() / 10, 0.0)
    assert torch.allclose(t.old_logp, expected)


def test_a_prompt_longer_than_its_sequence_is_an_error() -> None:
    batch = build_batch(0, [_ragged(1, [7, 8], [[1, 2], [3]])])
    batch.prompt_lens = np.array([2, 4], np.int64)
    with pytest.raises(ValueError, match="row 1: prompt_lens 4"):
        to_tensors(batch, pad_id=0)
