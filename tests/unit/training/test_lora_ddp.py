"""LoRA under DDP: two gloo ranks, each training its shard of a step, end with the adapter
one process gets from the whole step; the base weights stay as they were on every rank."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from grpo_stream.config import RunConfig, load_config

sys.path.insert(0, str(Path(__file__).parent))  # trainstates
from trainstates import ranks_and_one_process, train_rank

WORLD = 2
pytestmark = pytest.mark.slow  # torchrun, two ranks loading the model


def _config(run_dir: Path) -> RunConfig:
    lora = ["trainer.micro_batch=3", "trainer.lora.enabled=true", "trainer.lr=0.01"]
    return load_config(None, [f"run.run_dir={json.dumps(str(run_dir))}", *lora])


def test_two_lora_ranks_match_one_process_and_leave_the_base_alone(tmp_path: Path) -> None:
    before, after, ranks = ranks_and_one_process(__file__, tmp_path, _config, 4, WORLD)
    for got in ranks:
        for name, value in after.items():
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)
            if ".lora_" not in name:
                assert torch.equal(got[name], before[name]), name
    assert any(not torch.equal(before[n], after[n]) for n in after if "lora_B" in n)


if __name__ == "__main__":
    train_rank(sys.argv[1], _config, 4, WORLD)
