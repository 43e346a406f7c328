"""TrainBatch to padded tensors: alignment of tokens, masks and behaviour log-probs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_stream.hub.batches import build_batch
from grpo_stream.hub.replay import Group
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
    )


def test_only_valid_nonempty_completions_become_sequences() -> None:
    batch = build_batch(0, [_group()], trainer_version=2, stats={})
    assert batch.seq_offsets.tolist() == [0, 5]
    assert batch.input_ids.tolist() == [7, 8, 1, 2, 3]
    assert batch.advantages.tolist() == pytest.approx([0.7])
    assert batch.stats["staleness_mean"] == 1.0


def test_tensors_align_logprobs_with_completion_positions() -> None:
    g = _group()
    g.valid[:] = True
    g.rewards[:] = [1.0, 0.0, 0.5]
    t = to_tensors(build_batch(0, [g], trainer_version=1, stats={}), pad_id=0)
    assert t.input_ids.tolist() == [[7, 8, 1, 2, 3], [7, 8, 4, 5, 6]]
    assert t.completion_mask.tolist() == [[False, False, True, True, True]] * 2
    assert torch.allclose(t.old_logp[1, 2:], torch.tensor([-0.4, -0.5, -0.6]))
    assert float(t.old_logp[:, :2].abs().sum()) == 0.0


def test_slice_trims_padding_to_the_longest_row() -> None:
    g = _group()
    g.valid[:] = True
    g.completion_offsets = np.array([0, 1, 1, 6], np.int64)
    t = to_tensors(build_batch(0, [g], 0, {}), pad_id=0)
    assert t.input_ids.shape == (2, 7)
    assert t.slice(0, 1).input_ids.shape == (1, 3)


def test_logprob_count_mismatch_is_an_error() -> None:
    batch = build_batch(0, [_group()], 0, {})
    batch.behaviour_logprobs = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="behaviour log-probs"):
        to_tensors(batch, pad_id=0)


def test_staleness_is_never_negative() -> None:
    g = _group()  # policy version 1
    batch = build_batch(0, [g], trainer_version=0, stats={})  # the hub lags the generator
    assert batch.stats["staleness_mean"] == 0.0
