"""Helpers of the trainer-state tests (imported with this directory on sys.path): the real
TrainState on the shipped tiny model, and TrainBatches built by the hub's `build_batch`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_stream.config import load_config
from grpo_stream.hub.batches import build_batch
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.messages import SamplingParams, TrainBatch


def make_state(run_dir: Path, *overrides: str, resume: bool = False) -> Any:
    """TrainState.create on the shipped tiny model, float32, lr 1e-3."""
    from grpo_stream.training.state import TrainState

    torch.set_num_threads(1)
    cfg = load_config(
        None,
        [
            f"run.run_dir={json.dumps(str(run_dir))}",
            'model.dtype="float32"',
            "trainer.lr=1e-3",
            *overrides,
        ],
    )
    return TrainState.create(cfg, resume=resume)


def make_group(
    gid: int,
    rng: np.random.Generator,
    version: int = 0,
    adv_scale: float = 1.0,
    logprob: float | None = None,
) -> Group:
    """Four completions of 2..5 tokens (ids 3..200) with advantages +-adv_scale; behaviour
    log-probs random in [-6, -5), or all `logprob`."""
    lengths = rng.integers(2, 6, size=4)
    offsets = np.zeros(5, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    n = int(offsets[-1])
    lp = -5.0 - rng.random(n)
    if logprob is not None:
        lp[:] = logprob
    return Group(
        group_id=gid,
        policy_version=version,
        prompt_ids=rng.integers(3, 200, size=4).astype(np.int32),
        completion_ids=rng.integers(3, 200, size=n).astype(np.int32),
        completion_offsets=offsets,
        logprobs=lp.astype(np.float32),
        rewards=np.array([1, 0, 1, 0], dtype=np.float32),
        advantages=(adv_scale * np.array([1, -1, 1, -1])).astype(np.float32),
        valid=np.ones(4, dtype=bool),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
    )


def make_batch(
    step: int, seed: int = 0, version: int = 0, adv_scale: float = 1.0, **kw: Any
) -> TrainBatch:
    rng = np.random.default_rng(seed)
    groups = [make_group(g, rng, version, adv_scale, **kw) for g in range(3)]
    return build_batch(step, groups)


def params_of(state: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in state.model.named_parameters()}


def same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)
