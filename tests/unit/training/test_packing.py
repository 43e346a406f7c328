"""Packed token-budget micro-batches: the plan, the packed layout, and gradients equal to the
padded computation's (one process and two gloo ranks).

Relative difference of gradients: max over all parameters of |g_packed - g_padded|, divided
by the largest |g_padded|. In float32 the two computations round differently (other matmul
shapes, another micro-batch split); in float64 they agree to rounding (1e-10), which shows
the masks and positions are exact.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from grpo_stream.algo.bins import first_fit_rows
from grpo_stream.cli.service_exit import end_service_process
from grpo_stream.hub.batches import build_batch, build_step
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.messages import TrainBatch
from grpo_stream.training.batch import to_tensors
from grpo_stream.training.packing import pack_rows, plan, row_width

sys.path.insert(0, str(Path(__file__).parent))  # trainstates
from trainstates import grads, random_group, rel_diff, run_ranks, state_for

AGGREGATIONS = ("grpo", "dapo", "dr_grpo")
MAX_TOKENS = 30
WORLD = 2


def _group(gid: int, rng: np.random.Generator) -> Group:
    lengths = rng.integers(1, MAX_TOKENS, size=4)  # uneven completions, 1..29 tokens
    return random_group(gid, rng, lengths, prompt=(2, 9))


def _batches(groups: int = 6) -> tuple[TrainBatch, list[TrainBatch]]:
    """The whole step and its per-rank shards, with the hub's global totals."""
    rng = np.random.default_rng(0)
    gs = [_group(g, rng) for g in range(groups)]
    whole = build_batch(1, gs)
    shards = build_step(1, gs, whole.stats, world=WORLD)  # the hub's split
    return whole, shards


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # the machine is shared: more threads only contend


def _state(run_dir: Path, overrides: list[str]) -> Any:
    return state_for(run_dir, f"generator.max_tokens={MAX_TOKENS}", *overrides)


PADDED = ["trainer.packing=false", "trainer.micro_batch=1000", "trainer.share_prompts=false"]
"""The reference: one padded micro-batch holding the whole batch."""
PACKED = [
    "trainer.micro_batch_tokens=80",
    "algo.loss.logprob_chunk=1",
    "trainer.share_prompts=false",
]
"""Packed rows, several micro-batches of at most 80 token slots, log-probs one row at a time."""


# ---- the plan -------------------------------------------------------------------------------


def test_first_fit_rows_hold_every_sequence_once_within_the_width() -> None:
    lengths = [5, 9, 2, 7, 3, 3, 8]
    rows = first_fit_rows(lengths, width=10, per_row=3)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 10 and len(row) <= 3 for row in rows)
    assert len(rows) < len(lengths)  # several sequences share a row


def test_plan_keeps_each_micro_batch_within_tokens_and_sequences() -> None:
    lengths = [int(n) for n in np.random.default_rng(1).integers(1, 40, size=50)]
    for pack in (True, False):
        batches = plan(lengths, budget=100, max_seqs=6, pack=pack, width=max(lengths))
        for rows in batches:
            width = max(sum(lengths[i] for i in row) for row in rows)
            assert len(rows) * width <= 100
            assert sum(len(row) for row in rows) <= 6
        assert sorted(i for b in batches for row in b for i in row) == list(range(50))


def test_a_sequence_longer_than_the_budget_names_the_setting() -> None:
    with pytest.raises(ValueError, match=r"trainer\.micro_batch_tokens=10"):
        plan([4, 11], budget=10, max_seqs=8, pack=True, width=11)


def test_flash_attention_rows_take_the_whole_budget_dense_masks_the_longest() -> None:
    assert row_width("flash_attention_2", 4096, 300) == 4096
    assert row_width("sdpa", 4096, 300) == 300
    assert row_width("eager", 4096, 300) == 300


def test_packed_rows_restart_positions_and_index_each_sequence() -> None:
    t = to_tensors(_batches()[0], pad_id=0)
    lengths = t.attention_mask.sum(dim=1).tolist()
    rows = first_fit_rows(lengths, width=max(lengths), per_row=8)
    part = pack_rows(t, rows, pad_id=0)
    p = part.packing
    assert p is not None and p.input_ids.shape[0] == len(rows) < t.size
    real = part.attention_mask.bool()
    assert torch.equal(p.input_ids.reshape(-1)[p.index][real], part.input_ids[real])
    positions = p.position_ids.reshape(-1)[p.index]
    assert torch.equal(positions[real], (real.long().cumsum(1) - 1)[real])
    assert torch.equal(p.completion_mask.reshape(-1)[p.index] & real, part.completion_mask)


# ---- gradients ------------------------------------------------------------------------------


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_packed_gradients_equal_padded_in_float32(tmp_path: Path, aggregation: str) -> None:
    torch.manual_seed(0)
    agg = [f'algo.loss.aggregation="{aggregation}"']
    batch = _batches()[0]
    packed = _state(tmp_path / "a", agg + PACKED)
    parts = packed._micro_batches(to_tensors(batch, 0))
    assert len(parts) > 3 and all(p.packing is not None for p in parts)  # packed, several
    diff = rel_diff(grads(packed, batch), grads(_state(tmp_path / "b", agg + PADDED), batch))
    assert diff <= 1e-5


def test_packed_gradients_equal_padded_in_float64_with_kl(tmp_path: Path) -> None:
    over = ["algo.loss.beta=0.1"]  # the reference model's log-probs go through packing too
    states = [_state(tmp_path / str(i), over + mode) for i, mode in enumerate((PACKED, PADDED))]
    for s in states:
        s.model.double()
        s.ref_model.double()
    batch = _batches()[0]
    assert rel_diff(grads(states[0], batch), grads(states[1], batch)) <= 1e-10


def test_packed_step_changes_parameters(tmp_path: Path) -> None:
    state = _state(tmp_path, PACKED)
    before = [p.detach().clone() for p in state.model.parameters()]
    assert state.train_step(_batches()[0]).applied
    assert any(not torch.equal(b, p) for b, p in zip(before, state.model.parameters(), strict=True))


# ---- two ranks ------------------------------------------------------------------------------


def _rank(out: str) -> None:
    """One rank under torchrun: packed gradients of its shard (DDP-averaged), per loss."""
    import os

    from safetensors.torch import save_file

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    shard = _batches()[1][rank]
    for aggregation in AGGREGATIONS:
        agg = [f'algo.loss.aggregation="{aggregation}"']
        state = _state(Path(out) / f"rank{rank}", agg + PACKED)
        got = grads(state, shard)
        if rank == 0:
            save_file(got, str(Path(out) / f"{aggregation}.safetensors"))
    end_service_process(0)  # as a trainer rank ends: torch's gloo teardown can deadlock


@pytest.mark.slow  # torchrun: two ranks loading the model
def test_two_packed_ranks_match_one_padded_process(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    run_ranks(__file__, tmp_path, WORLD, timeout=240)
    for aggregation in AGGREGATIONS:
        agg = [f'algo.loss.aggregation="{aggregation}"']
        single = grads(_state(tmp_path / aggregation, agg + PADDED), _batches()[0])
        ddp = load_file(str(tmp_path / f"{aggregation}.safetensors"))
        assert rel_diff(ddp, single) <= 1e-5, aggregation


if __name__ == "__main__":
    _rank(sys.argv[1])
