"""DDP's overlapped, bucketed all-reduce vs one all-reduce per gradient after backward.

Two gloo ranks on the CPU (torchrun) train the same ~10M-parameter Qwen2 on the same batch.
"overlap": DistributedDataParallel all-reduces gradient buckets while backward still runs.
"after": plain model, loss.backward(), then all_reduce every gradient and divide by the
world size. "fsdp2": the same model sharded per decoder layer (grpo_stream.training.fsdp;
all-gathers in forward and backward, reduce-scatters overlapped with backward). Repetitions
interleave them (A B C A B C ...) so machine noise hits all alike; rank 0 prints the median
step time of each, the ratio fsdp2/overlap and, as the LAST line, the ratio after/overlap.

    python -m torch.distributed.run --standalone --nproc-per-node=2 -m bench.ddp
    python -m bench.ddp            # the same: re-launches itself under torchrun
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.common import add_smoke, parse


def _model(seed: int) -> Any:
    from grpo_stream.models.testing import tiny_qwen2

    shape = dict(hidden=256, intermediate=1024, layers=8, heads=4, kv_heads=2, positions=256)
    return tiny_qwen2(4096, seed, train=True, **shape)  # about 10M parameters


def _step_overlap(wrapped: Any, opt: Any, ids: Any) -> float:
    """One step of a model whose wrapper reduces gradients during backward (DDP, FSDP2)."""
    start = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    wrapped(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    return time.perf_counter() - start


def _step_after(model: Any, opt: Any, ids: Any, world: int) -> float:
    import torch.distributed as dist

    start = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    for p in model.parameters():  # one blocking all-reduce per gradient, after backward
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world
    opt.step()
    return time.perf_counter() - start


def run(reps: int, batch: int, seq: int, bucket_mb: float) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from grpo_stream.training.fsdp import shard_model

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, 4096, (batch, seq), generator=gen)  # (B, T): each rank its shard
    plain = _model(0)
    ddp = DistributedDataParallel(_model(0), bucket_cap_mb=bucket_mb)
    opt_plain = torch.optim.AdamW(plain.parameters(), lr=1e-4)
    opt_ddp = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    sharded = shard_model(_model(0))
    opt_sharded = torch.optim.AdamW(sharded.parameters(), lr=1e-4)  # over the DTensor shards
    _step_overlap(ddp, opt_ddp, ids), _step_after(plain, opt_plain, ids, world)  # warm-up
    _step_overlap(sharded, opt_sharded, ids)
    times: dict[str, list[float]] = {"overlap": [], "after": [], "fsdp2": []}
    for _ in range(reps):
        dist.barrier()
        times["overlap"].append(_step_overlap(ddp, opt_ddp, ids))
        dist.barrier()
        times["after"].append(_step_after(plain, opt_plain, ids, world))
        dist.barrier()
        times["fsdp2"].append(_step_overlap(sharded, opt_sharded, ids))
    if rank == 0:
        params = sum(p.numel() for p in plain.parameters())
        ov, af = statistics.median(times["overlap"]), statistics.median(times["after"])
        fs = statistics.median(times["fsdp2"])
        print(f"model {params / 1e6:.1f}M params, {world} gloo ranks, batch {batch}x{seq}/rank")
        print(f"overlap (DDP buckets {bucket_mb} MB): {ov * 1000:.1f} ms/step (median of {reps})")
        print(f"after backward (all_reduce per grad): {af * 1000:.1f} ms/step")
        print(f"fsdp2 (sharded per decoder layer): {fs * 1000:.1f} ms/step")
        print(f"ratio fsdp2/overlap: {fs / ov:.3f}")
        print(f"ratio after/overlap: {af / ov:.3f}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    add_smoke(parser)
    args = parse(parser, None, ["--reps", "1", "--batch", "1", "--seq", "16"])
    if "RANK" not in os.environ:  # not under torchrun yet: start two ranks of ourselves
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node=2", "-m", "bench.ddp", *sys.argv[1:]]
        raise SystemExit(subprocess.call(cmd))
    run(args.reps, args.batch, args.seq, args.bucket_mb)


if __name__ == "__main__":
    main()
