"""The trainer at real shapes for bench/gpu_scale.py (loaded from beside it, run with -P):
the full GRPO step (loss, regularizer, rollback guard and its restore point, optimizer) over
a grid of sequence lengths, layouts and activation checkpointing; FSDP2 on one rank against
plain training; and a profile of the precisions (the bf16-mixed question).

A cell trains `steps` batches after one warm-up batch. Each batch holds `groups` GRPO groups
of 8 completions of `completion` tokens after a `prompt`-token prompt (a sequence of
prompt + completion tokens, "1k" = 1024), token ids drawn from the vocabulary's first 250,
behaviour log-probs -ln(vocabulary) (what a random-init model gives: ratios near 1, so no
explosion rolls a step back). A cell that runs out of device memory is recorded as `oom`
with the memory it reached (a measurement: that shape does not fit that way), not a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import gpu_check  # type: ignore[import-not-found]  # loaded beside this file by gpu_scale.py
import gpu_shapes  # type: ignore[import-not-found]

LAYOUTS = {"rows": (True, True), "packed": (False, False)}
"""Layout name -> (trainer.share_prompts, trainer.prompt_rows): rows runs each prompt and its
completions in one row (it falls back to the prompt's KV cache where rows do not apply, and
to packing under activation checkpointing: the cell records what ran), packed packs whole
sequences padding-free."""


def model_dir(shape: Any, work: Path, device: str) -> Path:
    """A Hugging Face model directory of `shape` with random bf16 weights, built on `device`
    (kept under WORK/models for the other steps), with the shipped tiny tokenizer's
    byte-level vocabulary padded to the shape's (`<xN>` tokens) so every id decodes."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_stream.models.loading import load_tokenizer

    out = work / "models" / shape.name
    if (out / "model.safetensors.index.json").exists() or (out / "model.safetensors").exists():
        return out
    torch.manual_seed(0)
    config = Qwen2Config(**shape.config(), bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    del model
    tokenizer = load_tokenizer("grpo-stream/tiny-arith")
    tokenizer.save_pretrained(out)
    raw = json.loads((out / "tokenizer.json").read_text())
    vocab = raw["model"]["vocab"]
    for i in range(len(vocab) + len(raw["added_tokens"]), shape.vocab):
        vocab[f"<x{i}>"] = i
    (out / "tokenizer.json").write_text(json.dumps(raw))
    return out


def fixed_batch(seed: int, groups: int, prompt: int, completion: int, vocab: int) -> Any:
    """A TrainBatch of `groups` groups of 8 completions of `completion` tokens each."""
    import numpy as np

    from grpo_stream.hub.batches import build_batch

    rng = np.random.default_rng(seed)
    made = []
    for gid in range(groups):
        lengths = np.full(gpu_check.GROUP, completion, dtype=np.int64)
        made.append(gpu_check.group_of(rng, gid, prompt, lengths, -math.log(vocab)))
    return build_batch(1, made)


def step_tokens(prompt: int, completion: int, groups: int) -> Any:
    group = (completion,) * gpu_check.GROUP
    return gpu_shapes.StepTokens(prompt, tuple(group for _ in range(groups)))


def make_state(ns: argparse.Namespace, path: Path, run_dir: Path, sets: list[str]) -> Any:
    from grpo_stream.config import load_config
    from grpo_stream.training.state import TrainState

    base = [
        f"run.run_dir={json.dumps(str(run_dir))}",
        f"model.name_or_path={json.dumps(str(path))}",
        f'trainer.device="{ns.device}"',
        f"trainer.micro_batch_tokens={ns.micro_tokens}",
    ]
    return TrainState.create(load_config(None, base + sets))


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_steps(state: Any, batches: list[Any], device: str) -> tuple[list[float], list[Any]]:
    """Seconds of each step after the first (a warm-up), and every step's result."""
    import torch

    seconds, results = [], []
    for i, batch in enumerate(batches):
        _sync(device)
        if i == 1 and device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        results.append(state.train_step(batch))
        _sync(device)
        if i:
            seconds.append(time.perf_counter() - t0)
    return seconds, results


def _peak_gib(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def cell(
    ns: argparse.Namespace,
    shape: Any,
    path: Path,
    at: tuple[int, str, bool],
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One cell of the grid, `at` = (sequence length, layout, activation checkpointing):
    tokens/s, MFU, peak memory, the restore point's seconds; `extra` settings on top."""
    import torch

    seq, layout, ckpt = at
    share, rows = LAYOUTS[layout]
    completion = seq - ns.prompt
    groups = max(1, ns.step_tokens // (seq * gpu_check.GROUP))
    sets = [
        f"generator.max_tokens={completion}",
        f"trainer.share_prompts={str(share).lower()}",
        f"trainer.prompt_rows={str(rows).lower()}",
        f"trainer.gradient_checkpointing={str(ckpt).lower()}",
        *extra,
    ]
    out: dict[str, Any] = {"shape": shape.name, "seq": seq, "layout": layout, "ckpt": ckpt}
    out.update(groups=groups, sequences=groups * gpu_check.GROUP)
    seeds = range(ns.steps + 1)
    batches = [fixed_batch(seed, groups, ns.prompt, completion, shape.vocab) for seed in seeds]
    tokens = step_tokens(ns.prompt, completion, groups)
    state = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            state = make_state(ns, path, Path(tmp), sets)
            seconds, results = timed_steps(state, batches, ns.device)
            t0 = time.perf_counter()
            state.guard.snapshot(state, state.step)
            _sync(ns.device)
            snapshot_s = time.perf_counter() - t0
            precision, sharded = state.precision.mode, bool(state.fsdp)
    except torch.cuda.OutOfMemoryError as exc:
        out.update(ok=True, oom=True, peak_gib=_peak_gib(ns.device), error=str(exc)[:300])
        return out
    finally:
        del state
        _free(ns.device)
    step_s = sum(seconds) / len(seconds)
    flops = gpu_shapes.train_flops(shape, tokens)
    out.update(
        ok=all(r.applied for r in results),
        precision=precision,
        sharded=sharded,
        ran=results[-1].metrics.get("layout"),
        step_s=step_s,
        tokens_per_s=tokens.sequence_tokens / step_s,
        model_tflops=flops / 1e12,
        mfu=gpu_shapes.mfu(flops, step_s, ns.peak_tflops),
        peak_gib=_peak_gib(ns.device),
        snapshot_s=snapshot_s,
        loss=[float(r.metrics.get("loss", math.nan)) for r in results],
    )
    return out


def grid(ns: argparse.Namespace) -> list[tuple[int, str, bool]]:
    """The cells of one shape, most wanted first (the goals' cells: 4k, then 1k)."""
    cells = []
    for seq in ns.seqs:
        for layout in ("packed", "rows"):
            for ckpt in (True, False):
                cells.append((seq, layout, ckpt))
    return cells[: ns.max_cells] if ns.max_cells else cells


def trainer(ns: argparse.Namespace) -> dict[str, Any]:
    """Every cell of the grid for ns.shape, within ns.timeout; cells left are `skipped`."""
    shape = gpu_shapes.SHAPES[ns.shape]
    t_start = time.perf_counter()
    path = model_dir(shape, Path(ns.work), ns.device)
    built_s = time.perf_counter() - t_start
    cells: list[dict[str, Any]] = []
    for seq, layout, ckpt in grid(ns):
        spent = time.perf_counter() - t_start
        if cells and spent + 1.5 * max(c.get("wall_s", 0.0) for c in cells) > ns.timeout:
            skipped = {"seq": seq, "layout": layout, "ckpt": ckpt, "ok": True, "skipped": "time"}
            cells.append(skipped)
            continue
        t0 = time.perf_counter()
        result = cell(ns, shape, path, (seq, layout, ckpt))
        result["wall_s"] = time.perf_counter() - t0
        cells.append(result)
        print(json.dumps(result), flush=True)
    ran = [c for c in cells if "step_s" in c]
    return {
        "ok": bool(ran) and all(c["ok"] for c in cells),
        "shape": shape.name,
        "parameters": shape.parameters,
        "peak_tflops": ns.peak_tflops,
        "model_build_s": built_s,
        "cells": cells,
    }


@contextlib.contextmanager
def one_rank_group(device: str) -> Any:
    """A process group of one rank (NCCL on a GPU, gloo on the CPU), for FSDP2 at world 1."""
    import torch
    import torch.distributed as dist

    from grpo_stream.collectives import process_group_backend

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    backend = process_group_backend(device)
    bound = torch.device(device) if backend == "nccl" else None
    dist.init_process_group(backend, device_id=bound)
    try:
        yield
    finally:
        dist.destroy_process_group()


def fsdp(ns: argparse.Namespace) -> dict[str, Any]:
    """One cell plain, then under FSDP2 on one rank (NCCL on a GPU): the ratio of their step
    times is FSDP2's own cost (its wrappers, the collectives of a world of one)."""
    shape = gpu_shapes.SHAPES[ns.shape]
    path = model_dir(shape, Path(ns.work), ns.device)
    at = (ns.seqs[0], "packed", True)
    plain = cell(ns, shape, path, at)
    with one_rank_group(ns.device):
        sharded = cell(ns, shape, path, at, ('trainer.parallel="fsdp2"',))
    both = "step_s" in plain and "step_s" in sharded
    return {
        "ok": plain["ok"] and sharded["ok"] and both,
        "plain": plain,
        "fsdp2": sharded,
        "fsdp2_over_plain": sharded["step_s"] / plain["step_s"] if both else None,
    }


PRECISIONS = ("fp32", "bf16-mixed", "bf16")


def profile(ns: argparse.Namespace) -> dict[str, Any]:
    """gpu_check's trainer step (the shipped tiny model, its log-normal batches) in each
    precision: step seconds, and one step's top operators by self device time (self CPU
    time on the CPU) with the count of device kernels, to say where bf16-mixed's time goes."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = ns.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    sizes = (64, 64.0, 512) if cuda else (16, 24.0, 48)
    batches = [gpu_check.make_batch(s, *sizes) for s in range(ns.steps + 2)]
    tokens = sum(len(b.input_ids) for b in batches[1:-1])
    out: dict[str, Any] = {"ok": True, "tokens": tokens}
    for precision in PRECISIONS:
        with tempfile.TemporaryDirectory() as tmp:
            sets = [f'trainer.precision="{precision}"', f"generator.max_tokens={sizes[2]}"]
            state = make_state(ns, Path(ns.model_tiny), Path(tmp), sets)
            seconds, results = timed_steps(state, batches[:-1], ns.device)
            with torch_profile(activities=activities) as prof:
                state.train_step(batches[-1])
                _sync(ns.device)
            events = prof.key_averages()
            kernels = sum(e.count for e in events if cuda and e.self_device_time_total > 0)
            out[precision] = {
                "tokens_per_s": tokens / sum(seconds),
                "layout": results[-1].metrics.get("layout"),
                "device_kernels": kernels if cuda else None,
                "top_ops": events.table(sort_by=sort, row_limit=12),
            }
            out["ok"] = out["ok"] and all(r.applied for r in results)
            del state
            _free(ns.device)
    fp32 = out["fp32"]["tokens_per_s"]
    for precision in PRECISIONS[1:]:
        out[f"fp32_over_{precision}"] = fp32 / out[precision]["tokens_per_s"]
    return out
