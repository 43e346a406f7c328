"""The trainer's step on bench.vs_trl's batch shape: prompt rows, shared prompts on the KV
cache, and packed sequences.

Three TrainStates of the same model (trainer.share_prompts and trainer.prompt_rows on; share
on, rows off; share off; everything else bench.vs_trl's: grpo aggregation, beta 0, lr 2e-4)
train the same batches, alternating step by step in one process, so load on a shared machine
hits them alike. A batch: --prompts prompts of the task (`task.problem(i)`, the
tokenizer's ids) x G completions of uniform random length 1..--max-tokens, random tokens and
advantages, behaviour log-probs from the model (`with_model_logprobs`: random ones trip the
rollback guard every few steps): what a generator would send, without generating. Warm-up
steps first; `--profile` then runs torch.profiler over a few steps of each side and prints
the top ops by self CPU time.

Run: python -m bench.vs_trl_step --model PATH [--steps 6] [--threads 1] [--profile]
Before the last line: `ratio shared/rows step seconds: R`. Last line: `ratio packed/shared
step seconds: R`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import TINY_MODEL, add_smoke, environment, parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.vs_trl_step", description=__doc__)
    p.add_argument("--model", default=TINY_MODEL, help="model name or path (a 10x model dir)")
    p.add_argument("--task", choices=["arith", "countdown"], default="arith")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--steps", type=int, default=6, help="timed steps per side")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--profile", action="store_true", help="torch.profiler top ops per side")
    p.add_argument("--seed", type=int, default=0)
    add_smoke(p)
    return p


SMOKE = ["--prompts", "2", "--group-size", "2", "--max-tokens", "4", "--steps", "1",
         "--warmup", "1"]  # fmt: skip


def make_batch(args: argparse.Namespace, tokenizer: Any, task: Any, step: int) -> Any:
    import numpy as np

    from grpo_stream.hub.batches import build_batch
    from grpo_stream.hub.replay import Group
    from grpo_stream.protocols.messages import SamplingParams

    rng = np.random.default_rng(args.seed + step)
    g = args.group_size
    groups = []
    for i in range(args.prompts):
        prompt = task.problem(step * args.prompts + i).prompt
        lengths = rng.integers(1, args.max_tokens + 1, size=g)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        n = int(offsets[-1])
        rewards = rng.random(g).astype(np.float32)
        groups.append(
            Group(
                group_id=i,
                policy_version=0,
                prompt_ids=np.array(tokenizer(prompt)["input_ids"], dtype=np.int32),
                completion_ids=rng.integers(3, 250, size=n).astype(np.int32),
                completion_offsets=offsets,
                logprobs=(-rng.random(n) - 3.0).astype(np.float32),
                rewards=rewards,
                advantages=((rewards - rewards.mean()) / (rewards.std() + 1e-4)),
                valid=np.ones(g, dtype=bool),
                sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.max_tokens),
            )
        )
    return build_batch(step, groups)


def make_state(args: argparse.Namespace, run_dir: Path, share: bool, rows: bool = True) -> Any:
    from grpo_stream.config import load_config
    from grpo_stream.training.state import TrainState

    overrides = [
        f"run.run_dir={json.dumps(str(run_dir))}",
        f"model.name_or_path={json.dumps(args.model)}",
        f"generator.max_tokens={args.max_tokens}",
        "trainer.lr=2e-4",
        'algo.loss.aggregation="grpo"',
        "algo.loss.beta=0.0",
        f"trainer.share_prompts={str(share).lower()}",
        f"trainer.prompt_rows={str(rows).lower()}",
    ]
    return TrainState.create(load_config(None, overrides))


def with_model_logprobs(batch: Any, state: Any) -> Any:
    """`batch` with behaviour log-probs from `state`'s model itself, so the update is an
    ordinary one (random ones make ratios that trip the rollback guard every few steps)."""
    import torch

    from grpo_stream.algo.logprobs import token_logprobs
    from grpo_stream.training.batch import to_tensors

    t = to_tensors(batch, state._pad_id())
    with torch.no_grad():
        logp, _ = token_logprobs(state.model, t.input_ids, t.attention_mask, t.completion_mask,
                                 chunk=t.size, with_entropy=False)  # fmt: skip
    batch.behaviour_logprobs = logp[t.completion_mask].numpy()
    return batch


def top_ops(state: Any, batches: list[Any], rows: int = 12) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches:
            state.train_step(batch)
    return str(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main(argv: list[str] | None = None) -> None:
    args = parse(build_parser(), argv, SMOKE)
    import torch

    from grpo_stream.config.tasks import TaskSettings
    from grpo_stream.models.loading import load_tokenizer
    from grpo_stream.tasks import make_task

    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    task = make_task(TaskSettings(name=args.task))
    seconds: dict[str, list[float]] = {"rows": [], "shared": [], "packed": []}
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        sides = {
            name: make_state(args, Path(tmp) / name, name != "packed", name == "rows")
            for name in seconds
        }
        for step in range(args.warmup + args.steps):
            batch = with_model_logprobs(make_batch(args, tokenizer, task, step), sides["packed"])
            for name, state in sides.items():
                t0 = time.perf_counter()
                if not state.train_step(batch).applied:
                    raise SystemExit(f"{name}: step {step} was not applied")
                if state.layout != name:
                    raise SystemExit(f"{name}: the step ran {state.layout} micro-batches")
                if step >= args.warmup:
                    seconds[name].append(time.perf_counter() - t0)
        if args.profile:
            extra = [make_batch(args, tokenizer, task, 1000 + i) for i in range(3)]
            for name, state in sides.items():
                print(f"--- {name}: top ops over {len(extra)} steps")
                print(top_ops(state, extra))
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    env = environment()
    print(json.dumps({"args": vars(args), "load_average": env["load_average"], "step_s": seconds}))
    for name, m in medians.items():
        print(f"{name:7s} median step {m:.3f} s")
    print(f"ratio shared/rows step seconds: {medians['shared'] / medians['rows']:.2f}")
    print(f"ratio packed/shared step seconds: {medians['packed'] / medians['shared']:.2f}")


if __name__ == "__main__":
    main()
