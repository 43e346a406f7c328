"""pi_prox without an extra forward: with a deterministic training forward and one update
per batch the trainer takes a weighted mode's pi_prox from its with-grad forward; with
dropout, or several minibatches, the no-grad forward runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_stream.config import load_config
from grpo_stream.config.algo import WEIGHTED
from grpo_stream.hub.batches import build_batch
from grpo_stream.training.offpolicy import deterministic_forward

sys.path.insert(0, str(Path(__file__).parent))
from trainstates import make_batch, make_group, make_state


def forwards_of_one_step(run_dir: Path, *overrides: str, batch: Any = None) -> int:
    state = make_state(run_dir, *overrides)
    calls = [0]

    def count(*_: Any) -> None:
        calls[0] += 1

    state.model.register_forward_hook(count)
    assert state.train_step(make_batch(0) if batch is None else batch).applied
    return calls[0]


@pytest.mark.parametrize("mode", WEIGHTED)
def test_a_deterministic_forward_gives_pi_prox_without_another_forward(
    tmp_path: Path, mode: str
) -> None:
    plain = forwards_of_one_step(tmp_path / "b", 'algo.loss.off_policy="behaviour"')
    assert forwards_of_one_step(tmp_path / "t", f'algo.loss.off_policy="{mode}"') == plain


@pytest.mark.parametrize("mode", WEIGHTED)
def test_with_dropout_the_pi_prox_forward_runs(tmp_path: Path, mode: str) -> None:
    drop = ("trainer.dropout=true",)
    plain = forwards_of_one_step(tmp_path / "b", 'algo.loss.off_policy="behaviour"', *drop)
    got = forwards_of_one_step(tmp_path / "t", f'algo.loss.off_policy="{mode}"', *drop)
    assert got == 2 * plain


def test_several_minibatches_run_the_pi_prox_forward_once_per_batch(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    batch = build_batch(0, [make_group(g, rng) for g in range(4)])
    two = "trainer.minibatches=2"
    plain = forwards_of_one_step(
        tmp_path / "b", 'algo.loss.off_policy="behaviour"', two, batch=batch
    )
    tis = forwards_of_one_step(tmp_path / "t", 'algo.loss.off_policy="tis"', two, batch=batch)
    assert tis == 2 * plain  # pi_prox of both minibatches, before the first update


def test_dropout_anywhere_makes_the_forward_nondeterministic() -> None:
    assert deterministic_forward(load_config())
    assert not deterministic_forward(load_config(None, ["trainer.dropout=true"]))
    lora = ["trainer.lora.enabled=true", "trainer.lora.dropout=0.1"]
    assert not deterministic_forward(load_config(None, lora))
