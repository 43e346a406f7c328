"""LoRA under DDP: two gloo ranks, each training its shard of a step, end with the adapter
one process gets from the whole step; the base weights stay as they were on every rank."""

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
pytestmark = pytest.mark.slow  # torchrun, two ranks loading the model


def _group(gid: int, rng: np.random.Generator) -> Group:
    lengths = rng.integers(2, 7, size=4)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rewards = rng.random(4).astype(np.float32)
    return Group(
        group_id=gid,
        policy_version=0,
        prompt_ids=rng.integers(3, 20, size=5).astype(np.int32),
        completion_ids=rng.integers(3, 20, size=int(offsets[-1])).astype(np.int32),
        completion_offsets=offsets,
        logprobs=(-rng.random(int(offsets[-1])) - 0.5).astype(np.float32),
        rewards=rewards,
        advantages=((rewards - rewards.mean()) / (rewards.std() + 1e-4)).astype(np.float32),
        valid=np.ones(4, dtype=bool),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
    )


def _batches() -> tuple[TrainBatch, list[TrainBatch]]:
    rng = np.random.default_rng(0)
    groups = [_group(g, rng) for g in range(4)]
    whole = build_batch(1, groups)
    shards = build_step(1, groups, whole.stats, world=WORLD)  # the hub's split
    return whole, shards


def _config(run_dir: Path) -> RunConfig:
    return load_config(
        None,
        [f"run.run_dir={json.dumps(str(run_dir))}", "trainer.micro_batch=3",
         "trainer.lora.enabled=true", "trainer.lr=0.01"],
    )  # fmt: skip


def _params(state: object) -> dict[str, torch.Tensor]:
    model = state.model  # type: ignore[attr-defined]
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _rank(out: str) -> None:
    import os

    from safetensors.torch import save_file

    from grpo_stream.training.state import TrainState

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    state = TrainState.create(_config(Path(out) / f"rank{rank}"))
    assert state.train_step(_batches()[1][rank]).applied
    save_file(_params(state), str(Path(out) / f"rank{rank}.safetensors"))
    end_service_process(0)  # as a trainer rank ends: torch's gloo teardown can deadlock


def test_two_lora_ranks_match_one_process_and_leave_the_base_alone(
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
    for rank in range(WORLD):
        got = load_file(str(tmp_path / f"rank{rank}.safetensors"))
        for name, value in after.items():
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)
            if ".lora_" not in name:
                assert torch.equal(got[name], before[name]), name
    assert any(not torch.equal(before[n], after[n]) for n in after if "lora_B" in n)


if __name__ == "__main__":
    _rank(sys.argv[1])
