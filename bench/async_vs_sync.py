"""Asynchronous vs synchronous grpo-stream: the same work with max_staleness 1 and 0.

Two runs of `grpo-stream up` with identical settings (model, task, seed, steps, prompts
per step, G, max tokens, learning rate, torch threads, every group trained) except
`hub.max_staleness`: 0 (`--sync`: on-policy, generation waits for every update) and 1 (the
default: generators sample the next batch with the previous version while the trainer
updates). Rates are steady (steps 2..N, see bench/common.py). With --repeats N the modes
alternate N times and each mode's median run is reported (every run's rate is printed); the
order can be swapped with --sync-first/--async-first to see how much the machine's load drifts.

Run: python -m bench.async_vs_sync [--steps 40] [--generators 1]
Last line: `ratio async/sync steps/s: R (reward lastK async A sync B)`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.common import (
    TINY_MODEL,
    StepSeries,
    add_set,
    add_smoke,
    environment,
    fmt,
    median_run,
    parse,
    pipeline_overrides,
    plot_rewards,
    ran_with,
    results_path,
    run_pipeline,
    save_json,
    up_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="grpo-stream: max_staleness 1 vs 0")
    parser.add_argument("--steps", type=int, default=40, help="trainer steps of each run")
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--model", default=TINY_MODEL, help="model name or path")
    parser.add_argument("--generators", type=int, default=1, help="generator processes")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--last-k", type=int, default=20, help="K of the reward means")
    order = parser.add_mutually_exclusive_group()
    order.add_argument("--sync-first", dest="sync_first", action="store_true", default=True)
    order.add_argument("--async-first", dest="sync_first", action="store_false")
    add_set(parser, "extra_set", "extra setting for both runs (repeatable)")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs per mode")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    add_smoke(parser)
    return parser


SMOKE = ["--steps", "2", "--prompts-per-step", "2", "--group-size", "2", "--max-tokens", "4",
         "--last-k", "1"]  # fmt: skip


def overrides(args: argparse.Namespace) -> list[str]:
    return [
        *pipeline_overrides(
            model=args.model,
            group_size=args.group_size,
            prompts_per_step=args.prompts_per_step,
            max_tokens=args.max_tokens,
            lr=args.lr,
            threads=args.threads,
            seed=args.seed,
            steps=args.steps,
        ),
        f"generator.count={args.generators}",
        *args.extra_set,
    ]


def run_both(
    args: argparse.Namespace, tmp: Path
) -> tuple[dict[str, list[StepSeries]], dict[str, str]]:
    """Both modes `--repeats` times, alternating in the chosen order: (runs, command lines)."""
    sets = overrides(args)
    modes = ["sync", "async"] if args.sync_first else ["async", "sync"]
    runs: dict[str, list[StepSeries]] = {"sync": [], "async": []}
    commands: dict[str, str] = {}
    for repeat in range(args.repeats):
        for mode in modes:
            run_dir = tmp / f"{mode}-{repeat}"
            # async is the default max_staleness (1); say so explicitly in the run's config
            extra = [] if mode == "sync" else ["hub.max_staleness=1"]
            sync = mode == "sync"
            commands[mode] = " ".join(up_command(run_dir, args.steps, sets + extra, sync))
            name = "sync (max_staleness 0)" if sync else "async (max_staleness 1)"
            runs[mode].append(
                run_pipeline(name, run_dir, args.steps, sets + extra, sync, args.timeout)
            )
            ran_with(run_dir, "hub.max_staleness", 0 if sync else 1)
    return runs, commands


def main(argv: list[str] | None = None) -> None:
    args = parse(build_parser(), argv, SMOKE)
    if args.steps < 2 or min(args.last_k, args.generators, args.repeats) < 1:
        raise SystemExit("--steps must be >= 2, --last-k, --generators, --repeats >= 1")
    k = min(args.last_k, args.steps)
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        every, commands = run_both(args, Path(tmp))
    rates = {mode: [s.steps_per_s() for s in series] for mode, series in every.items()}
    if args.repeats > 1:
        print(f"steps/s of every repeat: {json.dumps(rates)}")
    runs = {mode: median_run(series) for mode, series in every.items()}
    for s in (runs["sync"], runs["async"]):
        print(
            f"{s.name:24s} steps/s {fmt(s.steps_per_s(), 3)}  completion tokens/s "
            f"{fmt(s.tokens_per_s(), 0)}  reward first{k} {fmt(s.reward_first(k))} "
            f"last{k} {fmt(s.reward_last(k))}  wall {fmt(s.total_s, 1)} s"
        )
    if not args.no_save:
        result: dict[str, Any] = {
            "args": vars(args),
            "commands": commands,
            "repeats_steps_per_s": rates,
            "env": environment(),
            "summary": {mode: s.summary(k) for mode, s in runs.items()},
            "series": {mode: s.to_json() for mode, s in runs.items()},
        }
        stem = results_path("async_vs_sync")
        plot_rewards(stem.with_suffix(".png"), [runs["sync"], runs["async"]], "grpo-stream")
        save_json(stem.with_suffix(".json"), result)
        print(f"saved {stem}.json/.png")
    ratio = runs["async"].steps_per_s() / runs["sync"].steps_per_s()
    print(
        f"ratio async/sync steps/s: {fmt(ratio)} (reward last{k} async "
        f"{fmt(runs['async'].reward_last(k))} sync {fmt(runs['sync'].reward_last(k))})"
    )


if __name__ == "__main__":
    main()
