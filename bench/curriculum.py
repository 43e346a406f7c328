"""The hub's curriculum from pass rates against uniform sampling and refill alone, on a dataset
of mixed difficulty built here: zero-signal groups per trained group, and reward against wall
time, side by side.

1. The dataset, built by measurement. Every `a+b=` problem with operands below --operands (the
   tiny model's own format) is sampled --probe-samples times by the shipped tiny model (hf
   engine, the runs' temperature) and scored by exact match: a problem is easy when its pass
   rate is at least --easy, hard when it is 0, medium when it lies in [0.25, 0.75]. The
   training file takes --rows problems of each level (a third each), the held-out file --held
   others of each level; JSONL rows {question, answer, level}.
2. Real `grpo-stream up` runs of the tiny model on the training file, each stopped (SIGTERM,
   a clean shutdown) once its trainer has trained --seconds, identical but for:
   - uniform: hub.max_refill_ratio = 0 (zero-signal groups dropped, steps served short);
   - refill: hub.max_refill_ratio = --ratio (dynamic sampling with refill, the default);
   - curriculum: refill and hub.curriculum.enabled, pass rates kept per prompt (each prompt
     comes again every epoch of the training file); curriculum_family keeps them per level
     instead (task.family_field = "level"), and curriculum_only has no refill.
3. Every run's checkpoints (one each --checkpoint-every steps; --evals of them, evenly spaced
   in time) are scored afterwards, in this process, with the same sampling seed: the reward on
   the whole training file (each problem once: the dataset's own mix, whatever the run
   sampled) and on the held-out file, --eval-k samples a problem.

Per run: zero-signal groups generated per trained group (the hub's counters: filtered /
trained), prompts passed over, and both rewards against the wall time of the checkpoint's step
(seconds from the trainer's start); at equal wall time: each curve interpolated at the time
of the earliest last checkpoint among the runs, and its mean over [0, that time].

    python -m bench.curriculum                    # uniform, refill, curriculum; 300 s each
    python -m bench.curriculum --arms uniform,refill,curriculum,curriculum_only --seeds 0,1

Last line: `zero-signal per trained uniform/curriculum Z, refill/curriculum Z2, dataset reward at
equal time ARM R ...` (means over the seeds).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from bench.common import (
    REPO_ROOT,
    TINY_MODEL,
    add_smoke,
    environment,
    parse,
    ran_with,
    results_path,
    save_json,
    up_command,
)
from bench.curriculum_data import Scorer, dataset, default_task_rows, write_jsonl

ARMS: dict[str, list[str]] = {
    "uniform": ["hub.max_refill_ratio=0.0"],
    "refill": [],
    "curriculum": ["hub.curriculum.enabled=true"],
    "curriculum_family": ["hub.curriculum.enabled=true", 'task.family_field="level"'],
    "curriculum_only": ["hub.max_refill_ratio=0.0", "hub.curriculum.enabled=true"],
}
"""Each compared run's settings on top of the shared ones (refill at --ratio unless set)."""
EXACT = '[{name="exact_match", weight=1.0}]'


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", default="uniform,refill,curriculum", help=f"of {', '.join(ARMS)}")
    p.add_argument("--seconds", type=float, default=300.0, help="trainer wall time of each run")
    p.add_argument("--steps", type=int, default=100_000, help="trainer steps at most (a cap)")
    p.add_argument("--seeds", default="0", help="comma-separated run.seed values")
    p.add_argument("--ratio", type=float, default=2.0, help="hub.max_refill_ratio (refill)")
    p.add_argument("--temperature", type=float, default=0.3, help="generator.temperature")
    p.add_argument("--group-size", type=int, default=8, help="generator.group_size")
    p.add_argument("--prompts-per-step", type=int, default=16, help="hub.groups_per_step")
    p.add_argument("--operands", type=int, default=30, help="candidates: a+b, a, b < this")
    p.add_argument("--probe-samples", type=int, default=16, help="samples per candidate")
    p.add_argument("--easy", type=float, default=0.9, help="pass rate of an easy problem")
    p.add_argument("--rows", type=int, default=24, help="training problems of each level")
    p.add_argument("--held", type=int, default=12, help="held-out problems of each level")
    p.add_argument("--checkpoint-every", type=int, default=5, help="trainer.checkpoint_every")
    p.add_argument("--evals", type=int, default=10, help="checkpoints scored per run")
    p.add_argument("--eval-k", type=int, default=16, help="samples per problem when scoring")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run at most")
    p.add_argument(
        "--default-task",
        action="store_true",
        help="train on the default task (arith, 441 distinct prompts) instead of the built "
        "dataset; the reward is scored on --rows x 3 of its problems",
    )
    p.add_argument("--name", default="curriculum", help="bench/results/NAME.json")
    add_smoke(p)
    return p


SMOKE = {
    "--seconds": "1",
    "--steps": "2",
    "--operands": "8",
    "--probe-samples": "4",
    "--easy": "0.75",
    "--rows": "2",
    "--held": "1",
    "--checkpoint-every": "1",
    "--evals": "2",
    "--eval-k": "1",
    "--group-size": "2",
    "--prompts-per-step": "2",
}
"""The smoke run's sizes (`--smoke`): seconds of probing, a step or two of each run."""


def shared_settings(args: argparse.Namespace, train: Path | None, seed: int) -> list[str]:
    """The settings every arm shares; `train`: the built training file (None: the default
    task)."""
    task = (
        [] if train is None else ['task.name="dataset"', f"task.dataset={json.dumps(str(train))}"]
    )
    return [
        *task,
        f"model.name_or_path={json.dumps(TINY_MODEL)}",
        f"generator.temperature={args.temperature}",
        f"generator.group_size={args.group_size}",
        f"generator.prompts_per_request={args.prompts_per_step}",
        f"hub.groups_per_step={args.prompts_per_step}",
        f"hub.max_refill_ratio={args.ratio}",
        f"task.rewards={EXACT}",
        f"run.seed={seed}",
        f"trainer.checkpoint_every={args.checkpoint_every}",
        "trainer.keep_checkpoints=100000",  # every one is scored afterwards
        "algo.advantage.filter_zero_signal=true",
    ]


def trained_seconds(metrics: Path) -> float:
    """The trainer's wall time at its last step so far (0 before the first)."""
    if not metrics.exists():
        return 0.0
    lines = [x for x in metrics.read_text().splitlines() if x.strip()]
    return float(json.loads(lines[-1])["wall_time"]) if lines else 0.0


def run_for(args: argparse.Namespace, run_dir: Path, sets: list[str]) -> None:
    """`grpo-stream up` until its trainer has trained --seconds (or --steps steps), then
    stopped as a user stops it: SIGTERM to the launcher we started, which shuts the services
    down cleanly (the hub writes its counters)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = up_command(run_dir, args.steps, sets)
    print("$ " + " ".join(argv), flush=True)
    metrics = run_dir / "metrics.jsonl"
    start = time.monotonic()
    with (run_dir / "up.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        try:
            while proc.poll() is None and trained_seconds(metrics) < args.seconds:
                if time.monotonic() - start > args.timeout:
                    raise RuntimeError(f"{run_dir}: not {args.seconds} s trained in --timeout")
                time.sleep(1.0)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=180)
        finally:
            if proc.poll() is None:  # did not stop in time: end it, and only it
                proc.kill()
                proc.wait()
    if not (run_dir / "hub" / "counters.json").exists() or trained_seconds(metrics) <= 0:
        tail = "\n".join((run_dir / "up.log").read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"grpo-stream up in {run_dir} trained nothing:\n{tail}")


def spread(points: list[tuple[float, Path]], count: int) -> list[tuple[float, Path]]:
    """At most `count` of the (time, checkpoint) points, evenly spaced in time, the last kept."""
    if len(points) <= count:
        return points
    targets = np.linspace(points[0][0], points[-1][0], count)
    times = np.array([t for t, _ in points])
    chosen = sorted({int(np.abs(times - t).argmin()) for t in targets})
    return [points[i] for i in chosen]


def checkpoint_times(run_dir: Path) -> list[tuple[float, Path]]:
    """(wall time of its step, path) of every complete checkpoint of the run, in time order."""
    from grpo_stream.training.checkpoint import complete_checkpoints

    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    wall = {int(r["step"]): float(r["wall_time"]) for r in rows}
    return sorted(
        (wall[step], path) for step, path in complete_checkpoints(run_dir) if step in wall
    )


@dataclass(frozen=True)
class Setup:
    """What every run of the comparison shares: the options, the sampler that scores
    checkpoints, and the row sets it scores them on (training file, held-out file)."""

    args: argparse.Namespace
    scorer: Scorer
    sets: dict[str, list[dict[str, Any]]]


def reward_curves(setup: Setup, run_dir: Path) -> dict[str, list[tuple[float, float]]]:
    """Per row set (training, held-out): (wall time, mean reward) at the start (the shipped
    model, time 0) and at --evals of the run's checkpoints; one sampling seed throughout."""
    points: list[tuple[float, Path | None]] = [(0.0, None)]
    points += spread(checkpoint_times(run_dir), setup.args.evals)
    curves: dict[str, list[tuple[float, float]]] = {name: [] for name in setup.sets}
    for version, (t, path) in enumerate(points):
        setup.scorer.load(path, version)
        for name, rows in setup.sets.items():
            rates = setup.scorer.pass_rates(rows, setup.args.eval_k, 7)
            curves[name].append((t, float(np.mean(rates))))
    return curves


def at_time(curve: list[tuple[float, float]], t: float) -> float:
    """The curve's value at time t, linear between its points."""
    xs, ys = zip(*curve, strict=True)
    return float(np.interp(t, xs, ys))


def mean_until(curve: list[tuple[float, float]], t: float) -> float:
    """The curve's mean over [0, t] (linear between its points, interpolated at t)."""
    grid = np.linspace(0.0, t, 201)
    xs, ys = zip(*curve, strict=True)
    return float(np.mean(np.interp(grid, xs, ys)))


def run_arm(setup: Setup, arm: str, base: list[str], run_dir: Path) -> dict[str, Any]:
    args = setup.args
    config = [*base, *ARMS[arm]]
    run_for(args, run_dir, config)
    ran_with(run_dir, "hub.curriculum.enabled", "hub.curriculum.enabled=true" in ARMS[arm])
    counters = json.loads((run_dir / "hub" / "counters.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    return {
        "arm": arm,
        "command": " ".join(up_command(run_dir, args.steps, config)),
        "counters": counters,
        "zero_per_trained": counters["filtered"] / max(1, counters["trained"]),
        "generated_per_trained": counters["dispatched"] / max(1, counters["trained"]),
        "skipped": counters.get("skipped", 0),
        "steps": len(rows),
        "wall_s": float(rows[-1]["wall_time"]),
        "signal_rate": [r.get("signal_rate") for r in rows],
        "curves": reward_curves(setup, run_dir),
    }


def summarise(runs: list[dict[str, Any]], arms: list[str]) -> dict[str, dict[str, float]]:
    """Per arm, means over its seeds: zero-signal and generated per trained group, prompts
    passed over, each reward at equal time and its mean until then."""
    t_equal = min(r["curves"]["dataset"][-1][0] for r in runs)
    out: dict[str, dict[str, float]] = {}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        row = {
            key: float(np.mean([r[key] for r in mine]))
            for key in ("zero_per_trained", "generated_per_trained", "skipped", "wall_s", "steps")
        }
        for name in mine[0]["curves"]:
            curves = [r["curves"][name] for r in mine]
            row[f"{name}_start"] = float(np.mean([c[0][1] for c in curves]))
            row[f"{name}_at_equal_time"] = float(np.mean([at_time(c, t_equal) for c in curves]))
            row[f"{name}_mean_until"] = float(np.mean([mean_until(c, t_equal) for c in curves]))
        out[arm] = {**row, "equal_time_s": t_equal}
    return out


def print_table(table: dict[str, dict[str, float]], names: list[str]) -> None:
    """The table, one row per arm; per scored row set (`names`): its reward at the start, at
    equal time and its mean until then."""
    t = next(iter(table.values()))["equal_time_s"]
    print(f"\nat equal wall time {t:.0f} s (the earliest last checkpoint among the runs):")
    sets = " | ".join(f"{n} reward: start, at equal time, mean until then" for n in names)
    print(f"| run | zero-signal / trained | generated / trained | skipped | steps | {sets} |")
    print("|---|---|---|---|---|" + "---|" * len(names))
    for arm, r in table.items():
        rewards = " | ".join(
            f"{r[f'{n}_start']:.3f}, {r[f'{n}_at_equal_time']:.3f}, {r[f'{n}_mean_until']:.3f}"
            for n in names
        )
        print(
            f"| {arm} | {r['zero_per_trained']:.2f} | {r['generated_per_trained']:.2f} | "
            f"{r['skipped']:.0f} | {r['steps']:.0f} | {rewards} |"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse(build_parser(), argv, [x for pair in SMOKE.items() for x in pair])
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"--arms: unknown {', '.join(unknown)} (known: {', '.join(ARMS)})")
    if args.default_task and "curriculum_family" in arms:
        raise SystemExit("--default-task: the default task has no family column")
    scorer = Scorer(args.temperature)
    sets = (
        {"dataset": default_task_rows(3 * args.rows)}
        if args.default_task
        else dataset(args, scorer)
    )
    setup = Setup(args, scorer, sets)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-curriculum-") as tmp:
        train = (
            None if args.default_task else write_jsonl(Path(tmp) / "train.jsonl", sets["dataset"])
        )
        for seed in [int(x) for x in args.seeds.split(",")]:
            base = shared_settings(args, train, seed)
            for arm in arms:  # the arms one after another in each seed: load drifts on all
                r = run_arm(setup, arm, base, Path(tmp) / f"{arm}-{seed}")
                runs.append(r)
                data = r["curves"]["dataset"]
                print(
                    f"seed {seed} {arm:17s} zero-signal/trained {r['zero_per_trained']:.2f} "
                    f"generated/trained {r['generated_per_trained']:.2f} skipped {r['skipped']} "
                    f"steps {r['steps']} wall {r['wall_s']:.0f}s dataset reward "
                    f"{data[0][1]:.3f} -> {data[-1][1]:.3f}",
                    flush=True,
                )
    table = summarise(runs, arms)
    print_table(table, list(sets))
    record = {"args": vars(args), "table": table, "runs": runs, "dataset": sets}
    save_json(results_path(f"{args.name}.json"), {**record, "environment": environment()})
    zero = {arm: row["zero_per_trained"] for arm, row in table.items()}
    cur = max(zero.get("curriculum", math.nan), 1e-9)
    uniform, refill = zero.get("uniform", math.nan) / cur, zero.get("refill", math.nan) / cur
    rewards = " ".join(f"{a} {row['dataset_at_equal_time']:.3f}" for a, row in table.items())
    print(
        f"zero-signal per trained uniform/curriculum {uniform:.2f}, refill/curriculum "
        f"{refill:.2f}, dataset reward at equal time {rewards}"
    )


if __name__ == "__main__":
    main()
