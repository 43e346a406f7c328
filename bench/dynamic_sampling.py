"""Dynamic sampling with refill against filter-only: full steps, the trainer's wait, reward.

Two parts, ratios side by side:
1. The hub's real ledger, buffer and batch desk on a simulated clock (bench.refill_sim), for
   zero-signal rates and generator costs set by hand: does refill fill every step, and what
   does it cost the trainer when generators have room (gen time per step below the step's)
   and when they do not, with a cost per prompt only and with a batched engine's fixed cost
   per lease (where one lease of a step's prompts and their replacements costs little more
   than the step's prompts alone).
2. Real `grpo-stream up` runs of the tiny model, identical but for the refill mode: filter
   (hub.max_refill_ratio = 0: a step runs short by its zero-signal groups), refill (ratio R,
   replacements leased once the losses are known: hub.refill_ahead = false) and ahead (ratio
   R, replacements planned from the recent signal rate and leased with the step's prompts:
   hub.refill_ahead = true), `--repeats` rounds alternating their order. G = 4 by default, so
   a fair share of arith groups come back all right or all wrong; every other setting is
   the default (credits included). Per mode (medians over rounds): steps served full, the
   trainer's mean wait per step (trainer_wait_s, steps 2..N) and per group trained, prompts
   generated per step, groups gone stale, reward.

Run: python -m bench.dynamic_sampling [--steps 60] [--ratio 2] [--repeats 2] [--smoke]
--smoke: a short simulation only (seconds), nothing saved.
Last line: `full steps F, wait refill/filter W` for the default mode (hub.refill_ahead's
default; the other mode's ratio is the line before), or the simulation's with --smoke.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from bench.common import (
    REPO_ROOT,
    RESULTS_DIR,
    TINY_MODEL,
    add_set,
    environment,
    fmt,
    run_pipeline,
    save_json,
    up_command,
)
from bench.refill_sim import SimSettings, simulate
from grpo_stream.config import HubSettings

SIM_CASES = [
    *((p, gen_s, 0.0) for p in (0.25, 0.5) for gen_s in (0.005, 0.02)),
    *((p, 0.005, 0.06) for p in (0.25, 0.5)),
]
"""(zero-signal rate, generator seconds per prompt, per lease) against a 0.2 s trainer step and
16 prompts a step: 0.005 a prompt leaves generators room for the refills, 0.02 makes them the
bottleneck; 0.06 a lease is a batched engine (a step's 16 prompts 0.14 s, in two leases 0.2 s)."""
MODES = ("filter", "refill", "ahead")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="refill vs filter-only dynamic sampling")
    parser.add_argument("--steps", type=int, default=60, help="trainer steps of each real run")
    parser.add_argument("--ratio", type=float, default=2.0, help="hub.max_refill_ratio")
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4, help="G")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sim-steps", type=int, default=300, help="steps of each simulation")
    parser.add_argument("--repeats", type=int, default=2, help="real rounds, modes alternating")
    add_set(parser, "extra_set", "extra setting for both real runs")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per real run")
    parser.add_argument("--smoke", action="store_true", help="a short simulation only")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    return parser


def simulations(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Refill, ahead and filter-only through the hub's code on a simulated clock, per case."""
    rows = []
    cases = SIM_CASES[:1] if args.smoke else SIM_CASES
    for p, gen_s, batch_s in cases:
        s = SimSettings(
            zero_signal=p,
            gen_s=gen_s,
            batch_s=batch_s,
            steps=args.sim_steps,
            seed=args.seed,
            batch=4 * args.prompts_per_step,
        )  # a lease: what the gate lets out, up to the credits of a batch engine
        refill, only = simulate(args.ratio, s), simulate(0.0, s)
        ahead = simulate(args.ratio, s, ahead=True)
        gps = s.groups_per_step
        rows.append(
            {
                "zero_signal": p,
                "gen_s_per_prompt": gen_s,
                "gen_s_per_lease": batch_s,
                "train_s": s.train_s,
                "full_refill": refill.full_share(gps),
                "full_filter": only.full_share(gps),
                "full_ahead": ahead.full_share(gps),
                "wait_refill_s": refill.mean_wait(),
                "wait_filter_s": only.mean_wait(),
                "wait_ahead_s": ahead.mean_wait(),
                "prompts_per_step_refill": refill.prompts / s.steps,
                "prompts_per_step_filter": only.prompts / s.steps,
                "prompts_per_step_ahead": ahead.prompts / s.steps,
                "stale_ahead": ahead.counters["stale"],
                "stale_refill": refill.counters["stale"],
            }
        )
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


def mode_sets(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each mode's settings beside the common ones."""
    ratio = f"hub.max_refill_ratio={args.ratio}"
    return {
        "filter": ["hub.max_refill_ratio=0.0"],
        "refill": [ratio, "hub.refill_ahead=false"],
        "ahead": [ratio, "hub.refill_ahead=true"],
    }


def real_runs(
    args: argparse.Namespace, tmp: Path
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """Every mode `--repeats` times, the order reversed each round (the load drifts)."""
    base = [
        f"model.name_or_path={json.dumps(TINY_MODEL)}",
        f"generator.group_size={args.group_size}",
        f"hub.groups_per_step={args.prompts_per_step}",
        f"run.seed={args.seed}",
        f"trainer.checkpoint_every={args.steps}",
        "algo.advantage.filter_zero_signal=true",
        *args.extra_set,
    ]
    out: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    commands: dict[str, str] = {}
    for round_ in range(args.repeats):
        for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
            run_dir = tmp / f"{mode}-{round_}"
            sets = [*base, *mode_sets(args)[mode]]
            commands[mode] = " ".join(up_command(run_dir, args.steps, sets))
            load = os.getloadavg()[0]
            run_pipeline(mode, run_dir, args.steps, sets, timeout_s=args.timeout)
            summary = run_summary(mode, run_dir, args.steps, args.prompts_per_step)
            out[mode].append({**summary, "load": [load, os.getloadavg()[0]]})
            print(
                f"round {round_ + 1} {mode}: wait/step {fmt(summary['wait_per_step_s'], 3)} s, "
                f"load {load:.1f}",
                flush=True,
            )
    return out, commands


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return float(np.median([r[key] for r in runs]))


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
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.smoke:
        args.sim_steps = min(args.sim_steps, 30)
    sims = simulations(args)
    print(
        "simulated (hub code, fake clock): zero-signal rate, gen s/prompt, gen s/lease | full "
        "refill/filter/ahead | wait s/step refill/filter/ahead | prompts/step refill/filter/ahead"
    )
    for r in sims:
        full = " / ".join(fmt(r[f"full_{m}"]) for m in ("refill", "filter", "ahead"))
        wait = " / ".join(fmt(r[f"wait_{m}_s"], 3) for m in ("refill", "filter", "ahead"))
        prompts = " / ".join(
            fmt(r[f"prompts_per_step_{m}"], 1) for m in ("refill", "filter", "ahead")
        )
        print(
            f"  p={r['zero_signal']:.2f} gen={r['gen_s_per_prompt']:.3f} "
            f"lease={r['gen_s_per_lease']:.2f} | {full} | {wait} | {prompts}"
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
    for mode, rounds in runs.items():
        first = _mean([_mean(r["reward"][:k]) for r in rounds])
        last = _mean([_mean(r["reward"][-k:]) for r in rounds])
        print(
            f"{mode:7s} full {fmt(median_of(rounds, 'full_share'))} groups/step "
            f"{fmt(median_of(rounds, 'mean_groups_per_step'), 1)} wait/step "
            f"{fmt(median_of(rounds, 'wait_per_step_s'), 3)} s wait/group "
            f"{fmt(median_of(rounds, 'wait_per_group_s'), 4)} s prompts/step "
            f"{fmt(median_of(rounds, 'prompts_per_step'), 1)} stale "
            f"{fmt(median_of(rounds, 'stale'), 0)} reward first{k} {fmt(first)} last{k} {fmt(last)}"
        )
    filter_wait = median_of(runs["filter"], "wait_per_step_s")
    ratios = {m: wait_ratio(median_of(runs[m], "wait_per_step_s"), filter_wait) for m in MODES}
    if not args.no_save:
        record = {
            "args": vars(args),
            "commands": commands,
            "env": environment(),
            "simulated": sims,
            "runs": runs,
        }
        path = save_json(RESULTS_DIR / "dynamic_sampling.json", record)
        print(f"saved {path.relative_to(REPO_ROOT)}")
    default = "ahead" if HubSettings().refill_ahead else "refill"
    other = "refill" if default == "ahead" else "ahead"
    print(
        f"{other} (not the default): full steps {fmt(median_of(runs[other], 'full_share'))}, "
        f"wait {other}/filter {fmt(ratios[other])}"
    )
    print(
        f"full steps {fmt(median_of(runs[default], 'full_share'))}, wait refill/filter "
        f"{fmt(ratios[default])} (the default: hub.refill_ahead={str(default == 'ahead').lower()})"
    )


if __name__ == "__main__":
    main()
