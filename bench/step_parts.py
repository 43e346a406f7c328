"""Where a trainer step's time goes at the workload matrix's smallest cell, besides compute.

At bench.vs_trl's base cell (the tiny model, 16 prompts x G 8, at most 8 new tokens) the
trainer is the pipeline's bottleneck: it computes ~93% of the wall time, the generator ~46%
(py-spy of `grpo-stream up`, docs/results.md). So a step's fixed costs, the parts that are
not the forward and backward, are what this bench times: one TrainState (the matrix's
settings, bench.vs_trl_step's `make_state`) trains batches of the cell's shape
(bench.vs_trl_step's `make_batch`, with behaviour log-probs from the model itself), each part
timed by wrapping the function that does it, plus the copy a publish makes (`build_snapshot`).

Run: python -m bench.step_parts [--steps 20] [--group-size 8] [--threads 1]
Last line: `step_parts: compute S ms, fixed F ms (P% of the step), top: NAME T ms`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import TINY_MODEL, add_smoke, environment, parse, results_path
from bench.vs_trl_step import make_batch, make_state, with_model_logprobs

COMPUTE = "forward and backward"
PARTS: dict[str, tuple[str, str]] = {
    COMPUTE: ("grpo_stream.training.state:TrainState", "_forward_backward"),
    "batch to tensors": ("grpo_stream.training.state", "to_tensors"),
    "finite check": ("grpo_stream.algo.rollback:RollbackGuard", "check"),
    "restore point": ("grpo_stream.algo.rollback:RollbackGuard", "after_step"),
    "regularizer": ("grpo_stream.algo.regularizer:GradRegularizer", "apply"),
    "optimizer": ("grpo_stream.training.precision:Precision", "step"),
}
"""Each timed part: (module[:class], function) whose calls are its time."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.step_parts", description=__doc__)
    p.add_argument("--model", default=TINY_MODEL)
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--seed", type=int, default=0)
    add_smoke(p)
    return p


def _target(spec: str) -> Any:
    import importlib

    module, _, cls = spec.partition(":")
    owner = importlib.import_module(module)
    return getattr(owner, cls) if cls else owner


@contextlib.contextmanager
def timed_parts(totals: dict[str, float]) -> Iterator[None]:
    """Add each PARTS function's wall time to `totals[name]` while inside."""
    saved: list[tuple[Any, str, Callable[..., Any]]] = []

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] = totals.get(name, 0.0) + time.perf_counter() - t0

        return timed

    try:
        for name, (spec, attr) in PARTS.items():
            owner = _target(spec)
            fn = getattr(owner, attr)
            saved.append((owner, attr, fn))
            setattr(owner, attr, wrap(name, fn))
        yield
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from grpo_stream.config.tasks import TaskSettings
    from grpo_stream.tasks import make_task
    from grpo_stream.transport.weights import build_snapshot

    torch.set_num_threads(args.threads)
    state = make_state(args, Path(tempfile.mkdtemp(prefix="step-parts-")), share=True)
    task = make_task(TaskSettings(name="arith"))
    batches = [
        with_model_logprobs(make_batch(args, state.tokenizer, task, step), state)
        for step in range(args.warmup + args.steps)
    ]
    per_step: list[dict[str, float]] = []
    for i, batch in enumerate(batches):
        totals: dict[str, float] = {}
        with timed_parts(totals):
            t0 = time.perf_counter()
            applied = state.train_step(batch).applied
            totals["step"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        build_snapshot(state.version, state.named_weights(), state.cfg.transport)
        totals["publish copy"] = time.perf_counter() - t0
        if not applied:
            raise RuntimeError(f"step {i + 1} was not applied: the bench needs ordinary steps")
        if i >= args.warmup:
            per_step.append(totals)
    names = [n for n in per_step[0] if n != "step"]
    ms = {n: 1000 * statistics.median(s.get(n, 0.0) for s in per_step) for n in names}
    step_ms = 1000 * statistics.median(s["step"] for s in per_step)
    return {"step_ms": step_ms, "parts_ms": ms, "args": vars(args), "environment": environment()}


def main(argv: list[str] | None = None) -> None:
    args = parse(build_parser(), argv, ["--steps", "2", "--warmup", "1", "--prompts", "4"])
    result = run(args)
    ms = result["parts_ms"]
    compute = ms[COMPUTE]
    fixed = {n: v for n, v in ms.items() if n != COMPUTE}
    # the publish copy runs after the step, outside its time: a share of step + publish
    whole = result["step_ms"] + ms["publish copy"]
    other = result["step_ms"] - sum(v for n, v in ms.items() if n != "publish copy")
    fixed["rest of the step"] = max(0.0, other)
    for name, value in sorted(fixed.items(), key=lambda kv: -kv[1]):
        print(f"{name:20s} {value:7.2f} ms")
    print(f"{COMPUTE:20s} {compute:7.2f} ms")
    out = results_path("step_parts.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    top = max(fixed, key=lambda n: fixed[n])
    total_fixed = sum(fixed.values())
    print(
        f"step_parts: compute {compute:.1f} ms, fixed {total_fixed:.1f} ms "
        f"({100 * total_fixed / whole:.0f}% of the step), top: {top} {fixed[top]:.2f} ms"
    )


if __name__ == "__main__":
    main()
