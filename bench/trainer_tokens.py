"""Trainer step throughput, packed vs padded micro-batches, and activation memory with and
without activation checkpointing, on the 10x model (CPU).

The model: bench.vs_trl's 10x Qwen2 (the tiny model's tokenizer, hidden and heads x2, layers
x2.5; randomly initialised, no warm start: the point is speed), loaded in fp32.
The batches: --sequences sequences (16 groups of 8 by default: 128) with prompts of 8..24
tokens and completion lengths drawn log-normal (median --median, sigma --sigma) clipped to
--min-len..--max-len (defaults 64, 1.0, 16..512: most completions are short, a few long).
The sides train the same batches, one after the other step by step (so load changes on the
machine hit them alike), with the same token budget trainer.micro_batch_tokens and threads:
- padded: one sequence per row, right-padded (trainer.packing = false);
- packed: sequences first-fit into rows (trainer.packing = true);
- checkpointed: packed, with trainer.gradient_checkpointing = true (its step time against
  packed's is the time cost of activation checkpointing).
tokens/s counts real tokens (prompt + completion), never padding; a warm-up step on a small
batch first. One timed step per side by default (--steps): at 128 sequences a padded step
of the 10x model takes minutes on two CPU cores.

Memory: two child processes (checkpointing off / on), run at the same time (each its own
process, so each RSS is its own; 1 torch thread each), each trains one warm-up step on a
small batch (so the optimizer state exists), then the measured packed batch while a thread
samples its RSS every 5 ms; activation memory = peak RSS during the step - RSS before it.
Their step times are not compared (they share the cores): the time cost comes from the
interleaved steps above.

Run: python -m bench.trainer_tokens [--steps 1] [--threads 2]
[--model PATH: a 10x model built before, skips the build]
Last line: `ratio packed/padded tokens/s: R`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import TINY_MODEL, add_smoke, environment, parse, results_path, save_json

GROUP = 8


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.trainer_tokens", description=__doc__)
    p.add_argument("--sequences", type=int, default=128, help="sequences per step (x8)")
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--median", type=float, default=64.0, help="log-normal median length")
    p.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma")
    p.add_argument("--steps", type=int, default=1, help="timed steps per side")
    p.add_argument("--model", default=None, help="an existing 10x model (skip the build)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (both sides)")
    p.add_argument("--micro-batch-tokens", type=int, default=4096)
    p.add_argument("--no-memory", action="store_true", help="skip the checkpointing part")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child-memory", default=None, help=argparse.SUPPRESS)  # model path
    p.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    add_smoke(p)
    return p


SMOKE = ["--sequences", "2", "--max-len", "32", "--min-len", "4", "--median", "8",
         "--threads", "1", "--micro-batch-tokens", "256", "--model", TINY_MODEL]  # fmt: skip
"""Smoke: the shipped tiny model instead of building the 10x one."""


def make_batch(args: argparse.Namespace, seed: int, sequences: int) -> Any:
    """One TrainBatch of `sequences` completions with log-normal lengths (see above)."""
    import numpy as np

    from grpo_stream.hub.batches import build_batch
    from grpo_stream.hub.replay import Group
    from grpo_stream.protocols.messages import SamplingParams

    rng = np.random.default_rng(seed)
    groups = []
    for gid in range(max(1, sequences // GROUP)):
        raw = rng.lognormal(np.log(args.median), args.sigma, size=GROUP)
        lengths = np.clip(raw.astype(np.int64), args.min_len, args.max_len)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        rewards = rng.random(GROUP).astype(np.float32)
        adv = ((rewards - rewards.mean()) / (rewards.std() + 1e-4)).astype(np.float32)
        total = int(offsets[-1])
        groups.append(
            Group(
                group_id=gid,
                policy_version=0,
                prompt_ids=rng.integers(3, 250, size=int(rng.integers(8, 25))).astype(np.int32),
                completion_ids=rng.integers(3, 250, size=total).astype(np.int32),
                completion_offsets=offsets,
                logprobs=(-rng.random(total) - 3.0).astype(np.float32),
                rewards=rewards,
                advantages=adv,
                valid=np.ones(GROUP, dtype=bool),
                sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.max_len),
            )
        )
    return build_batch(1, groups)


def make_state(args: argparse.Namespace, model: str, run_dir: Path, *extra: str) -> Any:
    from grpo_stream.config import load_config
    from grpo_stream.training.state import TrainState

    overrides = [
        f"run.run_dir={json.dumps(str(run_dir))}",
        f"model.name_or_path={json.dumps(model)}",
        f"generator.max_tokens={args.max_len}",
        f"trainer.micro_batch_tokens={args.micro_batch_tokens}",
        "trainer.micro_batch=4096",  # only the token budget bounds a micro-batch
        'trainer.device="cpu"',
        *extra,
    ]
    return TrainState.create(load_config(None, overrides))


def batch_tokens(batch: Any) -> int:
    return len(batch.input_ids)


def throughput(args: argparse.Namespace, model: str, tmp: Path) -> dict[str, Any]:
    """Both sides, step by step on the same batches: seconds per step and tokens/s."""
    from grpo_stream.training.batch import to_tensors

    own = "trainer.share_prompts=false"  # each side its own layout, not the shared one
    ckpt = ("trainer.packing=true", "trainer.gradient_checkpointing=true")
    sides = {
        "padded": make_state(args, model, tmp / "padded", "trainer.packing=false", own),
        "packed": make_state(args, model, tmp / "packed", "trainer.packing=true", own),
        "checkpointed": make_state(args, model, tmp / "checkpointed", *ckpt),
        "shared": make_state(
            args, model, tmp / "shared", "trainer.share_prompts=true", "trainer.prompt_rows=false"
        ),  # shared prompts on the KV cache (rows: bench.vs_trl_step, short groups)
    }
    layout = {"padded": "padded", "packed": "packed", "checkpointed": "packed", "shared": "shared"}
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    tokens = 0
    for step in range(args.steps + 1):  # step 0 warms up, on a small batch
        batch = make_batch(args, args.seed + step, args.sequences if step else GROUP)
        for name, state in sides.items():
            t0 = time.perf_counter()
            if not state.train_step(batch).applied:
                raise SystemExit(f"{name}: step {step} was not applied")
            if state.layout != layout[name]:
                raise SystemExit(f"{name}: the step ran {state.layout} micro-batches")
            if step:
                seconds[name].append(time.perf_counter() - t0)
        if step:
            tokens += batch_tokens(batch)
    out: dict[str, Any] = {"tokens": tokens}
    for name, state in sides.items():
        parts = state._micro_batches(to_tensors(batch, state._pad_id()))
        slots = sum(p.forward_shape[0] * p.forward_shape[1] for p in parts)
        out[name] = {
            "step_s": [round(s, 3) for s in seconds[name]],
            "tokens_per_s": tokens / sum(seconds[name]),
            "micro_batches_last_step": len(parts),
            "token_slots_last_step": slots,
        }
    out["padding_fraction"] = {
        name: 1 - batch_tokens(batch) / out[name]["token_slots_last_step"] for name in sides
    }
    packed_s, ckpt_s = sum(seconds["packed"]), sum(seconds["checkpointed"])
    out["checkpointing_time_cost"] = ckpt_s / packed_s - 1
    return out


def child_memory(args: argparse.Namespace) -> None:
    """One process: activation memory (MB) and seconds of one step; prints JSON."""
    import psutil
    import torch

    torch.set_num_threads(args.threads)
    extra = ["trainer.gradient_checkpointing=true"] if args.checkpointing else []
    with tempfile.TemporaryDirectory() as tmp:
        state = make_state(args, args.child_memory, Path(tmp), *extra)
        state.train_step(make_batch(args, 99, GROUP))  # optimizer state exists from here on
        proc = psutil.Process()
        base = proc.memory_info().rss
        peak = [base]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], proc.memory_info().rss)
                time.sleep(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        state.train_step(make_batch(args, args.seed, args.sequences))
        seconds = time.perf_counter() - t0
        done.set()
        sampler.join()
    print(json.dumps({"activation_mb": (peak[0] - base) / 2**20, "step_s": seconds}))


def memory(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """Activation memory with checkpointing off and on: two child processes at once."""
    children: dict[str, subprocess.Popen[str]] = {}
    for name, flag in (("plain", []), ("checkpointed", ["--checkpointing"])):
        cmd = [sys.executable, "-m", "bench.trainer_tokens", "--child-memory", model, *flag]
        cmd += ["--threads", "1", "--sequences", str(args.sequences)]
        cmd += ["--max-len", str(args.max_len), "--min-len", str(args.min_len)]
        cmd += ["--median", str(args.median), "--sigma", str(args.sigma)]
        cmd += ["--micro-batch-tokens", str(args.micro_batch_tokens), "--seed", str(args.seed)]
        children[name] = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    out: dict[str, Any] = {}
    for name, child in children.items():
        stdout, stderr = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"memory child ({name}) failed: {stderr[-2000:]}")
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    out["activation_reduction"] = (
        1 - out["checkpointed"]["activation_mb"] / out["plain"]["activation_mb"]
    )
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse(build_parser(), argv, SMOKE)
    if args.child_memory is not None:
        child_memory(args)
        return
    import torch

    from bench.vs_trl import build_10x, count_parameters

    torch.set_num_threads(args.threads)
    start, load_start = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            info = build_10x(TINY_MODEL, Path(tmp) / "model-10x", args.seed, sft_steps=0)
        else:
            info = {"path": args.model, "parameters": count_parameters(args.model)}
        print(f"10x model: {info['parameters']} parameters", flush=True)
        result = throughput(args, info["path"], Path(tmp))
        mem = None if args.no_memory else memory(args, info["path"])
    pad, pack = result["padded"], result["packed"]
    ratio = pack["tokens_per_s"] / pad["tokens_per_s"]
    print(f"{'side':12} {'tokens/s':>10} {'step s':>16} {'micro-batches':>14} {'padding':>8}")
    for name in ("padded", "packed", "checkpointed", "shared"):
        r = result[name]
        print(
            f"{name:12} {r['tokens_per_s']:10.1f} {r['step_s']!s:>16} "
            f"{r['micro_batches_last_step']:14d} {result['padding_fraction'][name]:8.1%}"
        )
    cost = result["checkpointing_time_cost"]
    print(f"activation checkpointing: step time {cost:+.0%} against packed (same batches)")
    if mem is not None:
        print(
            f"activation memory (packed, one step): plain {mem['plain']['activation_mb']:.0f} MB"
            f" / checkpointed {mem['checkpointed']['activation_mb']:.0f} MB: "
            f"{mem['activation_reduction']:.0%} lower"
        )
    wall = time.perf_counter() - start
    load = [round(load_start, 1), round(os.getloadavg()[0], 1)]
    print(f"wall {wall:.0f} s, 1-min load average {load[0]} at the start, {load[1]} at the end")
    save_json(
        results_path("trainer_tokens.json"),
        {
            "args": vars(args),
            "model": info,
            "throughput": result,
            "memory": mem,
            "ratio": ratio,
            "wall_s": round(wall, 1),
            "load_average_start_end": load,
            "environment": environment(),
        },
    )
    shared = result["shared"]["tokens_per_s"] / pack["tokens_per_s"]
    print(f"ratio packed/padded tokens/s: {ratio:.2f}, shared/packed {shared:.2f}")


if __name__ == "__main__":
    main()
