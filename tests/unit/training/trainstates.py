"""Helpers of the trainer-state tests (imported with this directory on sys.path): the real
TrainState on the shipped tiny model, TrainBatches built by the hub's `build_batch` from
random groups, gradients of one batch, and ranks started by torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_stream.cli.service_exit import end_service_process
from grpo_stream.config import RunConfig, load_config
from grpo_stream.hub.batches import build_batch, build_step
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.messages import SamplingParams, TrainBatch
from grpo_stream.training.batch import to_tensors

SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8)


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


def state_for(run_dir: Path, *overrides: str) -> Any:
    """TrainState.create on the shipped tiny model with the default settings but these."""
    from grpo_stream.training.state import TrainState

    cfg = load_config(None, [f"run.run_dir={json.dumps(str(run_dir))}", *overrides])
    return TrainState.create(cfg)


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


def rolled_back(state: Any, steps: int, keep: str) -> tuple[dict[str, torch.Tensor], list[Any]]:
    """`steps` applied steps, then step `steps` (trainer.fault_nan_step) rolled back for its
    non-finite loss; the weights, and each parameter's optimizer state `keep`, before it."""
    for step in range(steps):
        assert state.train_step(make_batch(step, seed=step)).applied
    weights = params_of(state)
    kept = [s[keep].clone() for s in state.optimizer.state.values()]
    result = state.train_step(make_batch(steps, seed=steps))
    assert not result.applied and result.metrics["rollback_cause"] == "non_finite_loss"
    assert not result.republish  # the restore point is the last applied step
    return weights, kept


def same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def random_group(
    gid: int,
    rng: np.random.Generator,
    lengths: np.ndarray,
    prompt: np.ndarray | int | tuple[int, int] = 5,
    version: int = 0,
    sampling: SamplingParams = SAMPLING,
) -> Group:
    """Four completions of `lengths` tokens (ids 3..19) drawn after them: rewards uniform in
    [0, 1) with their group-normalised advantages, behaviour log-probs in (-1.5, -0.5]. The
    prompt: these ids, that many random ids, or a random count in [low, high)."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rewards = rng.random(4).astype(np.float32)
    adv = ((rewards - rewards.mean()) / (rewards.std() + 1e-4)).astype(np.float32)
    if isinstance(prompt, tuple):
        prompt = int(rng.integers(*prompt))
    if isinstance(prompt, int):
        prompt = rng.integers(3, 20, size=prompt).astype(np.int32)
    return Group(
        group_id=gid,
        policy_version=version,
        prompt_ids=prompt,
        completion_ids=rng.integers(3, 20, size=int(offsets[-1])).astype(np.int32),
        completion_offsets=offsets,
        logprobs=(-rng.random(int(offsets[-1])) - 0.5).astype(np.float32),
        rewards=rewards,
        advantages=adv,
        valid=np.ones(4, dtype=bool),
        sampling=sampling,
    )


def grads(state: Any, batch: TrainBatch) -> dict[str, torch.Tensor]:
    """The gradients of one forward and backward over `batch` (no optimizer step)."""
    state.optimizer.zero_grad(set_to_none=True)
    t = to_tensors(batch, state._pad_id())
    t.old_logp = t.old_logp.to(next(state.model.parameters()).dtype)
    state._forward_backward(t, batch)
    return {n: p.grad.detach().clone() for n, p in state.model.named_parameters()}


def rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference between `a` and `b`, relative to the largest value of `b`."""
    scale = max(float(g.abs().max()) for g in b.values())
    return max(float((a[n] - b[n]).abs().max()) for n in b) / scale


def run_ranks(script: str, out: Path, world: int, timeout: float = 280) -> None:
    """`python script out` as `world` ranks under torchrun --standalone (gloo on the CPU);
    fails the test with the ranks' last output when one fails."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd = [*torchrun, f"--nproc-per-node={world}", script, str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


def step_and_shards(groups: int, world: int) -> tuple[TrainBatch, list[TrainBatch]]:
    """One step of `groups` random groups (completions of 2..6 tokens, prompts of 5) and its
    per-rank shards as the hub splits it, with the totals the hub adds."""
    rng = np.random.default_rng(0)
    made = [random_group(g, rng, rng.integers(2, 7, size=4)) for g in range(groups)]
    whole = build_batch(1, made)
    return whole, build_step(1, made, whole.stats, world=world)


def train_rank(out: str, config: Callable[[Path], RunConfig], groups: int, world: int) -> None:
    """One rank, started by torchrun (which sets RANK, WORLD_SIZE, MASTER_ADDR/PORT): one
    step on its shard of `step_and_shards(groups, world)`, its parameters saved to
    OUT/rankR.safetensors."""
    from safetensors.torch import save_file

    from grpo_stream.training.state import TrainState

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    state = TrainState.create(config(Path(out) / f"rank{rank}"))
    assert state.train_step(step_and_shards(groups, world)[1][rank]).applied
    save_file(params_of(state), str(Path(out) / f"rank{rank}.safetensors"))
    end_service_process(0)  # as a trainer rank ends: torch's gloo teardown can deadlock


def ranks_and_one_process(
    script: str, out: Path, config: Callable[[Path], RunConfig], groups: int, world: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """`script` (whose main is `train_rank`) as `world` ranks, then one process training on
    the whole step: its parameters before and after, and each rank's after."""
    from safetensors.torch import load_file

    from grpo_stream.training.state import TrainState

    torch.set_num_threads(1)
    run_ranks(script, out, world)
    single = TrainState.create(config(out / "single"))
    before = params_of(single)
    assert single.train_step(step_and_shards(groups, world)[0]).applied
    ranks = [load_file(str(out / f"rank{r}.safetensors")) for r in range(world)]
    return before, params_of(single), ranks
