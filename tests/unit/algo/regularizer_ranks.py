"""Worker of the two-rank regularizer test: each gloo rank holds one shard of the gradient.

Started by torch.multiprocessing.spawn from test_regularizer.py (this directory is on the
parent's sys.path, which spawn hands to the children).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from grpo_stream.algo.regularizer import GradRegularizer
from grpo_stream.config.algo import RegularizerSettings

FULL_GRADIENT = [float(i) for i in range(1, 11)]
SETTINGS = {"tau0": 5.0, "lam": 1.0}


def run(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        shard = torch.tensor(FULL_GRADIENT).chunk(world)[rank]
        param = torch.nn.Parameter(torch.zeros_like(shard))
        param.grad = shard.clone()
        stats = GradRegularizer(RegularizerSettings(**SETTINGS)).apply([param])
        result = {
            "scale": stats.scale,
            "norm_before": stats.norm_before,
            "grad": param.grad.tolist(),
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()
