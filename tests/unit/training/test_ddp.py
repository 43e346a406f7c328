"""Two gloo ranks on the CPU, each training on its shard of one step, end with the same
parameters as one process training on the whole step (the hub's split, DDP's averaging and
the global loss normalisers together)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_stream.cli.service_exit import end_service_process
from grpo_stream.config import RunConfig, load_config
from grpo_stream.hub.batches import build_batch, build_step
from grpo_stream.hub.replay import Group
from grpo_stream.protocols.messages import SamplingParams, TrainBatch

WORLD = 2
pytestmark = pytest.mark.slow  # over 20 s: torchrun, two ranks loading the model
GROUPS = 4


def _group(gid: int, rng: np.random.Generator) -> Group:
    lengths = rng.integers(2, 7, size=4)
    offsets = np.zeros(5, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    rewards = rng.random(4).astype(np.float32)
    adv = ((rewards - rewards.mean()) / (rewards.std() + 1e-4)).astype(np.float32)
    return Group(
        group_id=gid,
        policy_version=0,
        prompt_ids=rng.integers(3, 20, size=5).astype(np.int32),
        completion_ids=rng.integers(3, 20, size=int(offsets[-1])).astype(np.int32),
        completion_offsets=offsets,
        logprobs=(-rng.random(int(offsets[-1])) - 0.5).astype(np.float32),
        rewards=rewards,
        advantages=adv,
        valid=np.ones(4, dtype=bool),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
    )


def _batches(n_groups: int = GROUPS) -> tuple[TrainBatch, list[TrainBatch]]:
    """The whole step and its per-rank shards (the hub's split), with the totals the hub
    adds."""
    rng = np.random.default_rng(0)
    groups = [_group(g, rng) for g in range(n_groups)]
    whole = build_batch(1, groups)
    shards = build_step(1, groups, whole.stats, world=WORLD)  # the hub's split
    return whole, shards


def _config(run_dir: Path) -> RunConfig:
    # micro_batch 3: several micro-batches per rank, so no_sync accumulation is exercised
    return load_config(None, [f"run.run_dir={json.dumps(str(run_dir))}", "trainer.micro_batch=3"])


def _params(state: object) -> dict[str, torch.Tensor]:
    model = state.model  # type: ignore[attr-defined]
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _rank(out: str) -> None:
    """One rank, started by torchrun (which sets RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    import os

    from safetensors.torch import save_file

    from grpo_stream.training.state import TrainState

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    state = TrainState.create(_config(Path(out) / f"rank{rank}"))
    result = state.train_step(_batches()[1][rank])
    assert result.applied
    if rank == 0:
        save_file(_params(state), str(Path(out) / "ddp.safetensors"))
    end_service_process(0)  # as a trainer rank ends: torch's gloo teardown can deadlock


def test_two_ranks_on_shards_match_one_process_on_the_whole_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    from grpo_stream.training.state import TrainState

    torch.set_num_threads(1)
    for var in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd = [*torchrun, f"--nproc-per-node={WORLD}", __file__, str(tmp_path)]
    ranks = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    single = TrainState.create(_config(tmp_path / "single"))
    before = _params(single)
    assert single.train_step(_batches()[0]).applied
    after = _params(single)
    ddp = load_file(str(tmp_path / "ddp.safetensors"))
    assert any(not torch.equal(before[n], after[n]) for n in after)  # the step moved weights
    for name, value in after.items():
        torch.testing.assert_close(ddp[name], value, rtol=1e-5, atol=1e-6, msg=name)


if __name__ == "__main__":
    _rank(sys.argv[1])
