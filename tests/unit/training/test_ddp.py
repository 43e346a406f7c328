"""Two gloo ranks on the CPU, each training on its shard of one step, end with the same
parameters as one process training on the whole step (the hub's split, DDP's averaging and
the global loss normalisers together)."""

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
pytestmark = pytest.mark.slow  # over 20 s: torchrun, two ranks loading the model
GROUPS = 4


def _config(run_dir: Path) -> RunConfig:
    # micro_batch 3: several micro-batches per rank, so no_sync accumulation is exercised
    return load_config(None, [f"run.run_dir={json.dumps(str(run_dir))}", "trainer.micro_batch=3"])


def test_two_ranks_on_shards_match_one_process_on_the_whole_step(tmp_path: Path) -> None:
    before, after, ranks = ranks_and_one_process(__file__, tmp_path, _config, GROUPS, WORLD)
    assert any(not torch.equal(before[n], after[n]) for n in after)  # the step moved weights
    for name, value in after.items():
        torch.testing.assert_close(ranks[0][name], value, rtol=1e-5, atol=1e-6, msg=name)


if __name__ == "__main__":
    train_rank(sys.argv[1], _config, GROUPS, WORLD)
