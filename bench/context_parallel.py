"""Context parallelism: the longest sequence a trainer rank trains within a memory budget,
CP 2 against CP 1, and the time per token it costs.

The model: a Qwen2 built locally (hidden 256, MLP 1024, 4 layers, 4 heads of which 2 key
and value heads, the tiny model's character tokenizer; about 3.5M parameters), float32 on
the CPU, one torch thread per rank. A probe trains one step of one sequence of T tokens
(16 prompt tokens, T - 16 completion tokens) through the real trainer (`TrainState`: packed
rows, the GRPO loss, the regularizer, AdamW; CP 2 under DDP over its two ranks). Each
degree runs in one launch (torchrun for CP 2): the model loads, a warm-up step of 256 tokens
makes the gradients and AdamW's state, then probe after probe. A probe's memory is each
rank's peak resident set during its step over its resident set before it (the step's
activations, logits and temporaries; the model, gradients and optimizer state are in the
baseline; the peak is reset before each probe through /proc/self/clear_refs), the largest
over the ranks.

1. Longest sequence: for each degree, the longest T (to `--resolution` tokens) whose
   probe stays within `--budget-mb`: doubling from `--first`, then bisection.
2. Time per token at one length T1 (CP 1's longest): each search launch times `--steps`
   steps at T1 (CP 2's launch is given T1), then `--pairs` more launches per degree time
   it again, alternating CP 1 and CP 2 (load on a shared machine hits both alike); per
   side the median. Wall seconds per token; rank-seconds per token (wall x ranks: what the
   tokens cost in devices, on a machine whose ranks each have a core); CPU seconds per
   token summed over the ranks (what they cost in compute where ranks wait for a core).

Run: python -m bench.context_parallel [--budget-mb 256] [--pairs 2]
Last lines: `longest CP2/CP1: R`, then `time per token CP2/CP1 rank-seconds: R (wall R, CPU
seconds R)`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import TINY_MODEL, add_smoke, parse, results_path

PROMPT = 16  # prompt tokens of the probe's sequence
WARMUP = 256  # tokens of the warm-up step
MMAP_THRESHOLD = 1 << 17
"""glibc's mmap threshold in the probes (MALLOC_MMAP_THRESHOLD_): a fixed one, so a freed
tensor's pages leave the resident set at once (the default threshold rises after the first
large free, and later tensors then stay in the heap, resident after they are freed)."""
SHAPE = {"hidden": 256, "intermediate": 1024, "layers": 4, "heads": 4, "kv_heads": 2}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.context_parallel", description=__doc__)
    p.add_argument("--budget-mb", type=float, default=256.0, help="step memory per rank")
    p.add_argument("--first", type=int, default=1024, help="the first length tried")
    p.add_argument("--resolution", type=int, default=128, help="tokens the bisection resolves")
    p.add_argument("--max-length", type=int, default=1 << 16, help="longest length tried")
    p.add_argument("--pairs", type=int, default=2, help="more CP1/CP2 timings, alternating")
    p.add_argument("--steps", type=int, default=2, help="timed steps per launch")
    p.add_argument("--hidden", type=int, default=SHAPE["hidden"])
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    p.add_argument("--model-dir", default="", help="reuse (or build) the model here")
    for hidden in ("--launch", "--time-only"):  # a launch's own options
        p.add_argument(hidden, action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--degree", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--time-at", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    add_smoke(p)
    return p


SMOKE = ["--budget-mb", "16", "--first", "64", "--resolution", "64", "--pairs", "0"]
SMOKE += ["--steps", "1", "--hidden", "64", "--max-length", "512"]


def build_model(path: Path, hidden: int) -> Path:
    """The bench's model in `path` (built once: reused while its build.json matches)."""
    import torch

    from grpo_stream.models.loading import load_tokenizer, resolve_model
    from grpo_stream.models.testing import tiny_qwen2

    shape = {**SHAPE, "hidden": hidden, "intermediate": 4 * hidden}
    build = {"shape": shape, "vocab": 260, "seed": 0}
    marker = path / "build.json"
    if marker.exists() and json.loads(marker.read_text()) == build:
        return path
    torch.manual_seed(0)
    model = tiny_qwen2(260, 0, positions=1 << 17, tie=True, **shape)
    model.save_pretrained(path, safe_serialization=True)
    load_tokenizer(resolve_model(TINY_MODEL)).save_pretrained(path)
    marker.write_text(json.dumps(build))
    return path


def _batch(length: int, step: int) -> Any:
    """One sequence of `length` tokens: PROMPT prompt tokens, the rest completion, random
    ids, advantage 1, behaviour log-probs of a uniform policy (so the ratio stays near 1)."""
    import numpy as np

    from grpo_stream.hub.batches import build_batch
    from grpo_stream.hub.replay import Group
    from grpo_stream.protocols.messages import SamplingParams

    rng = np.random.default_rng(step)
    n = length - PROMPT
    group = Group(
        group_id=step,
        policy_version=0,
        prompt_ids=rng.integers(3, 260, size=PROMPT).astype(np.int32),
        completion_ids=rng.integers(3, 260, size=n).astype(np.int32),
        completion_offsets=np.array([0, n], dtype=np.int64),
        logprobs=np.full(n, -np.log(260.0), dtype=np.float32),
        rewards=np.ones(1, dtype=np.float32),
        advantages=np.ones(1, dtype=np.float32),
        valid=np.ones(1, dtype=bool),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=n),
    )
    return build_batch(step, [group])


def _status_mb(field: str) -> float:
    """A field of /proc/self/status (VmRSS, VmHWM) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _measure(state: Any, length: int, steps: int) -> tuple[float, float, float]:
    """(step memory MiB, the largest over the group's ranks; median step wall seconds, the
    largest over the ranks; median step CPU seconds, summed over the ranks) of `steps`
    steps of one `length` sequence."""
    import torch

    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap pages back to the system first
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from now
    before = _status_mb("VmRSS")
    wall, cpu = [], []
    for step in range(steps):
        start, used = time.perf_counter(), time.process_time()
        if not state.train_step(_batch(length, step + 1)).applied:
            raise RuntimeError(f"T {length}: the step did not apply")
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - used)
    peaks = torch.tensor([_status_mb("VmHWM") - before, statistics.median(wall)])
    spent = torch.tensor([statistics.median(cpu)])
    if state.world_size > 1:
        torch.distributed.all_reduce(peaks, op=torch.distributed.ReduceOp.MAX)
        torch.distributed.all_reduce(spent)
    return float(peaks[0]), float(peaks[1]), float(spent[0])


def search(state: Any, args: argparse.Namespace) -> tuple[int, list[dict[str, Any]]]:
    """The longest T within the budget (to args.resolution tokens), and every probe. Every
    rank takes the same decisions: they follow the all-reduced memory."""
    probes: list[dict[str, Any]] = []

    def fits(length: int) -> bool:
        memory, seconds, _ = _measure(state, length, 1)
        probes.append({"length": length, "memory_mb": round(memory, 1), "step_s": seconds})
        return memory <= args.budget_mb

    good, bad = 0, args.first
    while fits(bad):  # double until a length does not fit
        good = bad
        if bad >= args.max_length:
            return good, probes  # the budget holds the longest length tried
        bad = min(bad * 2, args.max_length)
    while bad - good > args.resolution:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    if good == 0:
        raise RuntimeError(f"even {args.first} tokens exceed --budget-mb {args.budget_mb}")
    return good, probes


def run_launch(args: argparse.Namespace) -> None:
    """One launch (one rank of it under torchrun): the search unless --time-only, then the
    timed steps at --time-at (or at the length found); rank 0 writes the JSON to --out."""
    import torch

    from grpo_stream.config import load_config
    from grpo_stream.training.state import TrainState

    torch.set_num_threads(1)
    degree = args.degree
    room = max(args.max_length, WARMUP)
    sets = [
        f"model.name_or_path={json.dumps(args.model_dir)}",
        f"run.run_dir={json.dumps(tempfile.mkdtemp(prefix='cp-bench-run-'))}",
        f"trainer.ranks={degree}",
        f"trainer.context_parallel={degree}",
        f"trainer.micro_batch_tokens={room + 1}",
        f"generator.max_tokens={room}",
        f"trainer.gradient_checkpointing={json.dumps(args.checkpointing)}",
    ]
    state = TrainState.create(load_config(None, sets))
    state.train_step(_batch(WARMUP, 0))
    found, probes = (0, []) if args.time_only else search(state, args)
    length = args.time_at or found
    memory, seconds, cpu = _measure(state, length, args.steps)
    if state.rank == 0:
        result = {
            "degree": degree,
            "longest": found,
            "probes": probes,
            "timed_length": length,
            "timed_memory_mb": round(memory, 1),
            "step_s": seconds,
            "cpu_s": cpu,
        }
        Path(args.out).write_text(json.dumps(result))


def launch(args: argparse.Namespace, degree: int, time_at: int, time_only: bool) -> dict[str, Any]:
    """A launch in fresh processes (torchrun for CP > 1): its JSON."""
    out = Path(tempfile.mkdtemp(prefix="cp-bench-")) / "launch.json"
    me = [sys.executable, "-m", "bench.context_parallel"]
    if degree > 1:
        torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={degree}"]
        me = [sys.executable, *torchrun, "-m", "bench.context_parallel"]
    opts = [
        "--launch",
        "--degree",
        str(degree),
        "--out",
        str(out),
        "--model-dir",
        args.model_dir,
        "--steps",
        str(args.steps),
        "--time-at",
        str(time_at),
        "--budget-mb",
        str(args.budget_mb),
        "--first",
        str(args.first),
        "--resolution",
        str(args.resolution),
        "--max-length",
        str(args.max_length),
    ]
    opts += ["--checkpointing"] * args.checkpointing + ["--time-only"] * time_only
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    done = subprocess.run([*me, *opts], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"CP {degree} failed: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    for probe in result["probes"]:
        print(f"CP{degree} T={probe['length']}: {probe['memory_mb']} MB", flush=True)
    print(f"CP{degree} T={result['timed_length']}: {result['step_s']:.3f} s/step", flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse(build_parser(), argv, SMOKE)
    if args.launch:
        run_launch(args)
        return
    if not args.model_dir:
        args.model_dir = tempfile.mkdtemp(prefix="cp-model-")
    build_model(Path(args.model_dir), args.hidden)
    load = os.getloadavg()[0]
    one = launch(args, 1, 0, time_only=False)
    length = one["longest"]
    two = launch(args, 2, length, time_only=False)
    runs = {1: [one], 2: [two]}
    for _ in range(args.pairs):
        for degree in (1, 2):
            runs[degree].append(launch(args, degree, length, time_only=True))
    wall = {d: statistics.median(r["step_s"] for r in runs[d]) / length for d in runs}
    cpu = {d: statistics.median(r["cpu_s"] for r in runs[d]) / length for d in runs}
    summary = {
        "budget_mb": args.budget_mb,
        "hidden": args.hidden,
        "checkpointing": args.checkpointing,
        "longest": {1: one["longest"], 2: two["longest"]},
        "probes": {1: one["probes"], 2: two["probes"]},
        "timed_length": length,
        "step_s": {d: [r["step_s"] for r in runs[d]] for d in runs},
        "cpu_s": {d: [r["cpu_s"] for r in runs[d]] for d in runs},
        "load_before": load,
        "load_after": os.getloadavg()[0],
    }
    results_path("context_parallel.json").write_text(json.dumps(summary, indent=1))
    print(f"load {load:.1f} -> {summary['load_after']:.1f}; budget {args.budget_mb} MB/rank")
    print(f"longest CP1 {one['longest']} tokens, CP2 {two['longest']} tokens")
    print(
        f"at T={length}, medians per token: CP1 {wall[1] * 1e3:.2f} ms wall, "
        f"{cpu[1] * 1e3:.2f} ms CPU; CP2 {wall[2] * 1e3:.2f} ms wall, {cpu[2] * 1e3:.2f} ms "
        "CPU (both ranks)"
    )
    print(f"longest CP2/CP1: {two['longest'] / one['longest']:.2f}")
    print(
        f"time per token CP2/CP1 rank-seconds: {2 * wall[2] / wall[1]:.2f} "
        f"(wall {wall[2] / wall[1]:.2f}, CPU seconds {cpu[2] / cpu[1]:.2f})"
    )


if __name__ == "__main__":
    main()
