"""Time to reward, defaults against defaults: `grpo-stream up` with only the model and the
dataset set, against TRL's GRPOTrainer with its defaults and the reward a TRL user writes.

Per task (bench/time_to_reward_tasks.py: short numeric answers, multiple choice, completions
of 64+ tokens) and seed, the sides run one at a time, each with the whole machine, in an order
that reverses every seed, each from its launch (start-up counts) for the task's wall budget
(bench/time_to_reward_runs.py):
- ours: `grpo-stream up --set model.name_or_path=M --set task.name="dataset" --set
  task.dataset=F` (and generator.max_tokens where the task's completions need more than 8);
- trl: GRPOTrainer with TRL's defaults (learning rate 1e-6, one prompt of 8 completions a
  step, ...), given `use_cpu`, the task's `max_completion_length` and a log line per step;
- trl-matched: TRL given our workload and learning rate (bench.vs_trl's configuration): not
  a default of TRL's, shown so that a TRL at its defaults is not the only yardstick.
`--alt NAME:SETTINGS` adds a side: ours with those settings, an alternative to a default
(`ours+NAME`), reported against ours: the time each took to reach TRL's final reward (the
matched TRL's where it ran) and each one's final reward.
Each side's reward is its mean training reward: at a moment, over the last `WINDOW`
completions sampled; a run's final reward is the mean over the last quarter of its
completions. Reported per task and seed, against each TRL side: TRL's final reward, the wall
time each side took to reach it (the same rule for both), ours / TRL's, and each side's
reward at the wall time TRL's run ended. Goal (#46): ours / TRL's time at most 1 / 1.5.

Run: python -m bench.time_to_reward [--tasks numeric choice long] [--seeds 0 1 2]
[--sides ours trl trl-matched] [--budget-scale 1.0] [--keep DIR] [--set SECTION.KEY=VALUE ...]
[--alt NAME:SECTION.KEY=VALUE[,...] ...] [--smoke]
Last line: `time to TRL's final reward, ours/TRL: TASK R (matched M) ...`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.common import add_set, add_smoke, environment, fmt, parse, results_path, save_json
from bench.time_to_reward_runs import SIDES, Curve, Job, run_ours, run_trl
from bench.time_to_reward_tasks import TASKS, task_model, write_dataset

WINDOW = 256
"""Completions the reward at a moment is the mean of (two of our steps)."""
GOAL = 1 / 1.5
SMOKE = ["--tasks", "choice", "--seeds", "0", "--budget-scale", "0.3", "--keep", "{tmp}/models"]
"""--smoke: the task without a model to build, every side for 45 s."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="time to reward: ours vs TRL, defaults")
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument(
        "--budget-scale", type=float, default=1.0, help="multiply each task's wall budget"
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="build the models once into DIR and reuse them"
    )
    parser.add_argument(
        "--alt",
        dest="alts",
        action="append",
        default=[],
        type=alternative,
        metavar="NAME:SECTION.KEY=VALUE[,...]",
        help="one more side: ours with these settings (an alternative to a default)",
    )
    add_set(parser, "ours_set", "a setting for each of our sides (not TRL's)")
    add_smoke(parser)
    return parser


def alternative(text: str) -> tuple[str, list[str]]:
    """--alt NAME:SET[,SET...] as (NAME, [SET, ...])."""
    name, _, sets = text.partition(":")
    if not name or not sets or "=" not in sets:
        raise argparse.ArgumentTypeError(f"expected NAME:SECTION.KEY=VALUE[,...], got {text!r}")
    return name, sets.split(",")


# ---- curves -----------------------------------------------------------------------------


def smoothed(curve: Curve, window: int = WINDOW) -> list[float]:
    """At each step's end: the mean reward of the last `window` completions (whole steps)."""
    out = []
    for i in range(len(curve.rewards)):
        total = count = 0.0
        for j in range(i, -1, -1):
            total += curve.rewards[j] * curve.counts[j]
            count += curve.counts[j]
            if count >= window:
                break
        out.append(total / count if count else math.nan)
    return out


def final_reward(curve: Curve) -> float:
    """Mean reward over the last quarter of the run's completions."""
    quarter = sum(curve.counts) / 4
    total = count = 0.0
    for reward, n in zip(reversed(curve.rewards), reversed(curve.counts), strict=True):
        total, count = total + reward * n, count + n
        if count >= quarter:
            break
    return total / count if count else math.nan


def time_to(curve: Curve, level: float) -> float:
    """Seconds from launch until the smoothed reward first reaches `level` (inf: never)."""
    for seconds, reward in zip(curve.seconds, smoothed(curve), strict=True):
        if reward >= level - 1e-9:
            return seconds
    return math.inf


def reward_at(curve: Curve, seconds: float) -> float:
    """The smoothed reward at the last step ended by `seconds` (nan before any)."""
    values = [r for s, r in zip(curve.seconds, smoothed(curve), strict=True) if s <= seconds]
    return values[-1] if values else math.nan


def against_default(ours: Curve, alt: Curve, level: float) -> dict[str, float]:
    """An alternative to our defaults against them: the time each took to reach `level`
    (TRL's final reward, or ours' without TRL), and each one's final reward."""
    t_ours, t_alt = time_to(ours, level), time_to(alt, level)
    return {
        "level": level,
        "ours_time_s": t_ours,
        "alt_time_s": t_alt,
        "alt_over_ours": t_alt / t_ours if t_ours > 0 else math.nan,
        "ours_final": final_reward(ours),
        "alt_final": final_reward(alt),
    }


def compare(ours: Curve, trl: Curve) -> dict[str, float]:
    """Ours against one TRL run: its final reward, the time each took to reach it, the
    reward of each at the wall time TRL's run ended."""
    level = final_reward(trl)
    t_trl, t_ours = time_to(trl, level), time_to(ours, level)
    end = trl.seconds[-1] if trl.seconds else math.nan
    return {
        "trl_final": level,
        "trl_time_s": t_trl,
        "ours_time_s": t_ours,
        "ratio": t_ours / t_trl if t_trl > 0 else math.nan,
        "trl_end_s": end,
        "ours_at_trl_end": reward_at(ours, end),
        "ours_final": final_reward(ours),
        "trl_steps": float(len(trl.seconds)),
        "ours_steps": float(len(ours.seconds)),
    }


# ---- runs -------------------------------------------------------------------------------


def run_task(args: argparse.Namespace, task: str, tmp: Path, keep: Path) -> list[dict[str, Any]]:
    """Every seed of `task`: each side once, alternating; one row per seed."""
    spec = TASKS[task]
    spec = replace(spec, budget_s=spec.budget_s * args.budget_scale)
    rows = []
    for i, seed in enumerate(args.seeds):
        model = task_model(spec, keep, seed=0)  # one model per task; the seed varies the run
        data = write_dataset(task, tmp / f"{task}-{seed}.jsonl", seed)
        curves: dict[str, Curve] = {}
        alts = dict(args.alts)
        sides = [*args.sides, *(f"ours+{name}" for name in alts)]
        order = sides if i % 2 == 0 else sides[::-1]
        for side in order:
            job = Job(side, spec, model, data, seed, spec.budget_s)
            where = tmp / f"{task}-{seed}-{side}"
            if side.startswith("ours"):
                extra = alts.get(side.removeprefix("ours+"), [])
                curves[side] = run_ours(job, where, [*args.ours_set, *extra])
            else:
                curves[side] = run_trl(job, where.with_suffix(".json"))
            c = curves[side]
            print(
                f"{task} seed {seed} {side:11s} steps {len(c.seconds):4d} final reward "
                f"{fmt(final_reward(c))} load {c.load[0]:.1f}-{c.load[1]:.1f}",
                flush=True,
            )
        row: dict[str, Any] = {
            "task": task,
            "seed": seed,
            "order": list(order),
            "curves": {s: asdict(c) for s, c in curves.items()},
        }
        for side in ("trl", "trl-matched"):
            if side in curves and "ours" in curves:
                row[side] = compare(curves["ours"], curves[side])
        row["alts"] = alternatives(curves)
        rows.append(row)
    return rows


def alternatives(curves: dict[str, Curve]) -> dict[str, dict[str, float]]:
    """Each `ours+NAME` side against ours, to TRL's final reward (the matched TRL's when it
    ran, else the default TRL's, else ours')."""
    if "ours" not in curves:
        return {}
    reference = curves.get("trl-matched") or curves.get("trl") or curves["ours"]
    level = final_reward(reference)
    return {
        side.removeprefix("ours+"): against_default(curves["ours"], curve, level)
        for side, curve in curves.items()
        if side.startswith("ours+")
    }


def report(rows: list[dict[str, Any]]) -> str:
    """A line per task, seed and TRL side; the last line (median over seeds per task)."""
    for row in rows:
        for side in ("trl", "trl-matched"):
            if side in row:
                c = row[side]
                print(
                    f"{row['task']:8s} seed {row['seed']} vs {side:11s}: TRL final "
                    f"{fmt(c['trl_final'])} reached at {fmt(c['trl_time_s'], 1)} s by TRL, "
                    f"{fmt(c['ours_time_s'], 1)} s by ours (ours/TRL {fmt(c['ratio'])}); at "
                    f"TRL's end ({fmt(c['trl_end_s'], 0)} s) ours {fmt(c['ours_at_trl_end'])}"
                )
        for name, alt in row["alts"].items():
            print(
                f"{row['task']:8s} seed {row['seed']} ours+{name}: reward {fmt(alt['level'])} "
                f"reached at {fmt(alt['alt_time_s'], 1)} s, ours at {fmt(alt['ours_time_s'], 1)} "
                f"s (alt/ours {fmt(alt['alt_over_ours'])}); final {fmt(alt['alt_final'])}, ours "
                f"{fmt(alt['ours_final'])}"
            )
    parts = []
    for task in dict.fromkeys(r["task"] for r in rows):
        ratios = {
            side: [r[side]["ratio"] for r in rows if r["task"] == task and side in r]
            for side in ("trl", "trl-matched")
        }
        med = {s: statistics.median(v) if v else math.nan for s, v in ratios.items()}
        parts.append(f"{task} {fmt(med['trl'])} (matched {fmt(med['trl-matched'])})")
    return f"time to TRL's final reward, ours/TRL: {', '.join(parts)} (goal <= {GOAL:.2f})"


def main(argv: list[str] | None = None) -> None:
    args = parse(build_parser(), argv, SMOKE)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ttr-") as tmp:
        keep = args.keep or Path(tmp) / "models"
        for task in args.tasks:
            rows += run_task(args, task, Path(tmp), keep)
    last = report(rows)
    path = save_json(
        results_path("time_to_reward.json"),
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "env": environment(),
            "window": WINDOW,
            "rows": rows,
        },
    )
    print(f"saved {path}")
    print(last)


if __name__ == "__main__":
    main()
