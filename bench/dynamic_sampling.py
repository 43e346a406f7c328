"""Dynamic sampling with refill against filter-only: full steps, the trainer's wait, reward.

Two parts, ratios side by side:
1. The hub's real ledger, buffer and batch desk on a simulated clock (bench.refill_sim), for
   zero-signal rates and generator speeds set by hand: does refill fill every step, and what
   does it cost the trainer when generators have room (gen time per step below the step's)
   and when they do not.
2. Three real `grpo-stream up` runs of the tiny model, identical but for
   hub.max_refill_ratio: R (refill), 0 (filter only: a step runs short by its zero-signal
   groups), and R with hub.refill_ahead (replacements planned before the losses are known).
   G = 4 by default, so a fair share of arith groups come back all right or all wrong. Per
   run: steps served full, the trainer's mean wait per step (trainer_wait_s, steps 2..N) and
   per group trained, prompts generated per step, reward.

Run: python -m bench.dynamic_sampling [--steps 60] [--ratio 2] [--smoke]
--smoke: a short simulation only (seconds), nothing saved.
Last line: `full steps F, wait refill/filter W` (the real runs; the simulation's with --smoke).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from bench.common import (
    REPO_ROOT,
    RESULTS_DIR,
    TINY_MODEL,
    environment,
    fmt,
    run_pipeline,
    save_json,
    up_command,
)
from bench.refill_sim import SimSettings, simulate

SIM_CASES = [(p, gen_s) for p in (0.25, 0.5) for gen_s in (0.005, 0.02)]
"""(zero-signal rate, generator seconds per prompt) against a 0.2 s trainer step and 16
prompts a step: 0.005 leaves generators room for the refills, 0.02 makes them the bottleneck."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="refill vs filter-only dynamic sampling")
    parser.add_argument("--steps", type=int, default=60, help="trainer steps of each real run")
    parser.add_argument("--ratio", type=float, default=2.0, help="hub.max_refill_ratio")
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4, help="G")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sim-steps", type=int, default=300, help="steps of each simulation")
    parser.add_argument(
        "--set",
        dest="extra_set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="extra setting for both real runs",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per real run")
    parser.add_argument("--smoke", action="store_true", help="a short simulation only")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    return parser


def simulations(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Refill and filter-only through the hub's code on a simulated clock, per case."""
    rows = []
    cases = SIM_CASES[:1] if args.smoke else SIM_CASES
    for p, gen_s in cases:
        s = SimSettings(zero_signal=p, gen_s=gen_s, steps=args.sim_steps, seed=args.seed)
        refill, only = simulate(args.ratio, s), simulate(0.0, s)
        ahead = simulate(args.ratio, s, ahead=True)
        gps = s.groups_per_step
        rows.append({
            "zero_signal": p, "gen_s_per_prompt": gen_s, "train_s": s.train_s,
            "full_refill": refill.full_share(gps), "full_filter": only.full_share(gps),
            "full_ahead": ahead.full_share(gps),
            "wait_refill_s": refill.mean_wait(), "wait_filter_s": only.mean_wait(),
            "wait_ahead_s": ahead.mean_wait(),
            "prompts_per_step_refill": refill.prompts / s.steps,
            "prompts_per_step_filter": only.prompts / s.steps,
            "stale_ahead": ahead.counters["stale"], "stale_refill": refill.counters["stale"],
        })  # fmt: skip
    return rows


def run_summary(name: str, run_dir: Path, steps: int, gps: int) -> dict[str, Any]:
    """A real run's numbers from its metrics.jsonl."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows.sort(key=lambda r: int(r["step"]))
    groups = [int(r["step_groups"]) for r in rows]
    waits = [float(r["trainer_wait_s"]) for r in rows[1:]]
    counters = json.loads((run_dir / "hub" / "counters.json").read_text())
    rewards = [r["reward_mean"] for r in rows]
    return {
        "name": name,
        "steps": len(rows),
        "full_share": sum(g == gps for g in groups) / len(groups),
        "mean_groups_per_step": float(np.mean(groups)),
        "wait_per_step_s": float(np.mean(waits)),
        "wait_per_group_s": float(np.sum(waits) / max(1, sum(groups[1:]))),
        "prompts_per_step": counters["dispatched"] / len(rows),
        "refilled": counters.get("refilled", 0),
        "filtered": counters["filtered"],
        "stale": counters["stale"],
        "signal_rate_last": rows[-1]["signal_rate"],
        "reward": [None if v is None else float(v) for v in rewards],
        "step_groups": groups,
        "trainer_wait_s": [float(r["trainer_wait_s"]) for r in rows],
    }


def real_runs(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, Any], dict[str, str]]:
    base = [
        f"model.name_or_path={json.dumps(TINY_MODEL)}",
        f"generator.group_size={args.group_size}",
        f"generator.prompts_per_request={args.prompts_per_step}",
        f"hub.groups_per_step={args.prompts_per_step}",
        f"run.seed={args.seed}",
        f"trainer.checkpoint_every={args.steps}",
        "algo.advantage.filter_zero_signal=true",
        *args.extra_set,
    ]
    out: dict[str, Any] = {}
    commands: dict[str, str] = {}
    modes = {
        "refill": [f"hub.max_refill_ratio={args.ratio}"],
        "filter": ["hub.max_refill_ratio=0.0"],
        "ahead": [f"hub.max_refill_ratio={args.ratio}", "hub.refill_ahead=true"],
    }
    for mode, extra in modes.items():
        run_dir = tmp / mode
        sets = [*base, *extra]
        commands[mode] = " ".join(up_command(run_dir, args.steps, sets))
        run_pipeline(mode, run_dir, args.steps, sets, timeout_s=args.timeout)
        out[mode] = run_summary(mode, run_dir, args.steps, args.prompts_per_step)
    return out, commands


def wait_ratio(refill: float, filter_only: float) -> float:
    """refill / filter-only; 1.0 when neither waited (refill was no worse), inf when only it
    did."""
    if filter_only > 0:
        return refill / filter_only
    return 1.0 if refill <= 0 else math.inf


def _mean(values: list[Any]) -> float:
    good = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(good)) if good else math.nan


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.smoke:
        args.sim_steps = min(args.sim_steps, 30)
    sims = simulations(args)
    print(
        "simulated (hub code, fake clock): zero-signal rate, gen s/prompt | full refill/filter"
        "/ahead | wait s/step refill/filter/ahead | prompts/step refill/filter"
    )
    for r in sims:
        full = f"{fmt(r['full_refill'])} / {fmt(r['full_filter'])} / {fmt(r['full_ahead'])}"
        wait = (
            f"{fmt(r['wait_refill_s'], 3)} / {fmt(r['wait_filter_s'], 3)} / "
            f"{fmt(r['wait_ahead_s'], 3)}"
        )
        prompts = f"{fmt(r['prompts_per_step_refill'], 1)} / {fmt(r['prompts_per_step_filter'], 1)}"
        print(
            f"  p={r['zero_signal']:.2f} gen={r['gen_s_per_prompt']:.3f} "
            f"| {full} | {wait} | {prompts}"
        )
    if args.smoke:
        first = sims[0]
        ratio = wait_ratio(first["wait_refill_s"], first["wait_filter_s"])
        print(
            f"full steps {fmt(first['full_refill'])}, wait refill/filter {fmt(ratio)} (simulated)"
        )
        return
    with tempfile.TemporaryDirectory(prefix="bench-refill-") as tmp:
        runs, commands = real_runs(args, Path(tmp))
    k = min(10, args.steps)
    for r in runs.values():
        print(f"{r['name']:7s} full {fmt(r['full_share'])} groups/step "
              f"{fmt(r['mean_groups_per_step'], 1)} wait/step {fmt(r['wait_per_step_s'], 3)} s "
              f"wait/group {fmt(r['wait_per_group_s'], 4)} s prompts/step "
              f"{fmt(r['prompts_per_step'], 1)} reward first{k} {fmt(_mean(r['reward'][:k]))} "
              f"last{k} {fmt(_mean(r['reward'][-k:]))}")  # fmt: skip
    wait = wait_ratio(runs["refill"]["wait_per_step_s"], runs["filter"]["wait_per_step_s"])
    ahead = wait_ratio(runs["ahead"]["wait_per_step_s"], runs["filter"]["wait_per_step_s"])
    if not args.no_save:
        path = save_json(RESULTS_DIR / "dynamic_sampling.json", {
            "args": vars(args), "commands": commands, "env": environment(),
            "simulated": sims, "runs": runs,
        })  # fmt: skip
        print(f"saved {path.relative_to(REPO_ROOT)}")
    print(f"refill ahead: full steps {fmt(runs['ahead']['full_share'])}, wait ahead/filter "
          f"{fmt(ahead)}")  # fmt: skip
    print(f"full steps {fmt(runs['refill']['full_share'])}, wait refill/filter {fmt(wait)}")


if __name__ == "__main__":
    main()
