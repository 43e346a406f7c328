"""The hub's curriculum from pass rates against uniform sampling and refill alone, on a dataset
of mixed difficulty built here: zero-signal groups per trained group, held-out reward against
wall time.

1. The dataset, built by measurement. Every `a+b=` problem with operands below --operands (the
   tiny model's own format) is sampled --probe-samples times by the shipped tiny model (hf
   engine, the runs' temperature) and scored by exact match: a problem is easy when its pass
   rate is at least --easy, hard when it is 0, medium when it lies in [0.25, 0.75]. The
   training file takes --rows problems of each level (a third each), the held-out file half as
   many others of each level; JSONL rows {question, answer, level}.
2. Real `grpo-stream up` runs of the tiny model on the training file, identical but for:
   - uniform: hub.max_refill_ratio = 0 (zero-signal groups dropped, steps served short);
   - refill: hub.max_refill_ratio = --ratio (dynamic sampling with refill, the default);
   - curriculum: refill and hub.curriculum.enabled, pass rates kept per prompt (each prompt
     comes again every epoch of the training file); curriculum_family keeps them per level
     instead (task.family_field = "level"), and curriculum_only has no refill.
   The evaluator service scores every run's policy on the whole held-out file every
   --eval-every steps (eval.k samples a problem, exact match).

Per run: zero-signal groups generated per trained group (the hub's counters: filtered /
trained), prompts passed over, held-out reward at each evaluation against the wall time of its
step (seconds from the trainer's start), and at equal wall time: each run's curve interpolated
at the time the shortest run's last evaluation was made, and its mean over [0, that time].

    python -m bench.curriculum                    # uniform, refill, curriculum; 60 steps
    python -m bench.curriculum --arms uniform,refill,curriculum,curriculum_family --seeds 0,1

Last line: `zero-signal per trained uniform/curriculum Z, held-out reward at equal time
curriculum R_C refill R_R uniform R_U` (means over the seeds).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from bench.common import (
    TINY_MODEL,
    add_smoke,
    environment,
    parse,
    ran_with,
    results_path,
    run_pipeline,
    save_json,
    up_command,
)

LEVELS = ("easy", "medium", "hard")
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
    p.add_argument("--steps", type=int, default=60, help="trainer steps of each run")
    p.add_argument("--seeds", default="0", help="comma-separated run.seed values")
    p.add_argument("--ratio", type=float, default=2.0, help="hub.max_refill_ratio (refill)")
    p.add_argument("--temperature", type=float, default=0.3, help="generator.temperature")
    p.add_argument("--group-size", type=int, default=8, help="generator.group_size")
    p.add_argument("--prompts-per-step", type=int, default=16, help="hub.groups_per_step")
    p.add_argument("--operands", type=int, default=30, help="candidates: a+b, a, b < this")
    p.add_argument("--probe-samples", type=int, default=16, help="samples per candidate")
    p.add_argument("--easy", type=float, default=0.9, help="pass rate of an easy problem")
    p.add_argument("--rows", type=int, default=24, help="training problems of each level")
    p.add_argument("--eval-every", type=int, default=5, help="eval.every (trainer steps)")
    p.add_argument("--eval-k", type=int, default=4, help="eval.k")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    p.add_argument("--name", default="curriculum", help="bench/results/NAME.json")
    add_smoke(p)
    return p


SMOKE = {
    "--steps": "2",
    "--operands": "8",
    "--probe-samples": "4",
    "--easy": "0.75",
    "--rows": "2",
    "--eval-every": "1",
    "--eval-k": "1",
    "--group-size": "2",
    "--prompts-per-step": "2",
}
"""The smoke run's sizes (`--smoke`): seconds of probing, two steps of each run."""


def probe(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every candidate with the tiny model's pass rate on it (sampled, exact match)."""
    import torch

    from grpo_stream.config.tasks import RewardSpec
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.models.loading import load_policy, load_tokenizer
    from grpo_stream.rewards import load_reward

    torch.set_num_threads(1)
    policy = load_policy(TINY_MODEL, dtype="float32", device="cpu", trainable=False)
    engine = HFEngine(policy, load_tokenizer(TINY_MODEL), "cpu")
    exact = load_reward(RewardSpec(name="exact_match"))
    pairs = [(a, b) for a in range(args.operands) for b in range(args.operands)]
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs]
    for start in range(0, len(rows), 100):
        part = rows[start : start + 100]
        groups = engine.generate(
            [r["question"] for r in part], args.probe_samples, 8, args.temperature, seed=start
        )
        for row, group in zip(part, groups, strict=True):
            ref = {"answer": row["answer"]}
            texts = [c.text for c in group.completions]
            passed = [exact(t, prompt=row["question"], reference=ref) for t in texts]
            row["pass_rate"] = float(np.mean(passed))
    return rows


def level(rate: float, easy: float) -> str | None:
    if rate >= easy:
        return "easy"
    if rate == 0.0:
        return "hard"
    return "medium" if 0.25 <= rate <= 0.75 else None


def split(
    rows: list[dict[str, Any]], args: argparse.Namespace, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, held-out rows): --rows and --rows / 2 of each level, disjoint."""
    held = max(1, args.rows // 2)
    train: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    for name in LEVELS:
        pool = [r for r in rows if level(r["pass_rate"], args.easy) == name]
        if len(pool) < args.rows + held:
            raise SystemExit(
                f"only {len(pool)} {name} problems among {len(rows)} candidates (need "
                f"{args.rows + held}): raise --operands or --probe-samples, or lower --rows"
            )
        random.Random(f"{seed}:{name}").shuffle(pool)
        keep = [{**r, "level": name} for r in pool[: args.rows + held]]
        train += keep[: args.rows]
        evals += keep[args.rows :]
    return train, evals


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def shared_settings(args: argparse.Namespace, train: Path, evals: Path, seed: int) -> list[str]:
    n_eval = sum(1 for _ in evals.open())
    return [
        f"model.name_or_path={json.dumps(TINY_MODEL)}",
        f"generator.temperature={args.temperature}",
        f"generator.group_size={args.group_size}",
        f"generator.prompts_per_request={args.prompts_per_step}",
        f"hub.groups_per_step={args.prompts_per_step}",
        f"hub.max_refill_ratio={args.ratio}",
        'task.name="dataset"',
        f"task.dataset={json.dumps(str(train))}",
        f"task.rewards={EXACT}",
        f"eval.every={args.eval_every}",
        'eval.task.name="dataset"',
        f"eval.task.dataset={json.dumps(str(evals))}",
        f"eval.task.rewards={EXACT}",
        f"eval.problems={n_eval}",
        f"eval.k={args.eval_k}",
        f"run.seed={seed}",
        f"trainer.checkpoint_every={args.steps}",
        "algo.advantage.filter_zero_signal=true",
    ]


def eval_curve(run_dir: Path) -> list[tuple[float, float]]:
    """(wall time of the evaluated version's step, held-out reward), in time order; version
    0 (before training) at time 0."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    wall = {int(r["policy_version"]): float(r["wall_time"]) for r in rows}
    wall[0] = 0.0
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines() if x]
    curve = [
        (wall[int(e["policy_version"])], float(e["eval/reward"]))
        for e in evals
        if int(e["policy_version"]) in wall
    ]
    return sorted(curve)


def at_time(curve: list[tuple[float, float]], t: float) -> float:
    """The curve's held-out reward at time t, linear between evaluations."""
    xs, ys = zip(*curve, strict=True)
    return float(np.interp(t, xs, ys))


def mean_until(curve: list[tuple[float, float]], t: float) -> float:
    """The curve's mean over [0, t] (trapezoids between evaluations, interpolated at t)."""
    grid = np.linspace(0.0, t, 201)
    xs, ys = zip(*curve, strict=True)
    return float(np.mean(np.interp(grid, xs, ys)))


def run_arm(args: argparse.Namespace, arm: str, base: list[str], run_dir: Path) -> dict[str, Any]:
    sets = [*base, *ARMS[arm]]
    run_pipeline(arm, run_dir, args.steps, sets, timeout_s=args.timeout)
    ran_with(run_dir, "hub.curriculum.enabled", "hub.curriculum.enabled=true" in ARMS[arm])
    counters = json.loads((run_dir / "hub" / "counters.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    return {
        "arm": arm,
        "command": " ".join(up_command(run_dir, args.steps, sets)),
        "counters": counters,
        "zero_per_trained": counters["filtered"] / max(1, counters["trained"]),
        "generated_per_trained": counters["dispatched"] / max(1, counters["trained"]),
        "skipped": counters.get("skipped", 0),
        "steps": len(rows),
        "wall_s": float(rows[-1]["wall_time"]),
        "train_reward": [r.get("reward_mean") for r in rows],
        "curve": eval_curve(run_dir),
    }


def summarise(runs: list[dict[str, Any]], arms: list[str]) -> dict[str, dict[str, float]]:
    """Per arm, means over its seeds: zero-signal and generated per trained group, prompts
    passed over, held-out reward at equal time and its mean until then."""
    t_equal = min(r["curve"][-1][0] for r in runs)
    out: dict[str, dict[str, float]] = {}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        out[arm] = {
            "zero_per_trained": float(np.mean([r["zero_per_trained"] for r in mine])),
            "generated_per_trained": float(np.mean([r["generated_per_trained"] for r in mine])),
            "skipped": float(np.mean([r["skipped"] for r in mine])),
            "wall_s": float(np.mean([r["wall_s"] for r in mine])),
            "reward_at_equal_time": float(np.mean([at_time(r["curve"], t_equal) for r in mine])),
            "reward_mean_until": float(np.mean([mean_until(r["curve"], t_equal) for r in mine])),
            "reward_start": float(np.mean([r["curve"][0][1] for r in mine])),
            "equal_time_s": t_equal,
        }
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse(build_parser(), argv, [x for pair in SMOKE.items() for x in pair])
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"--arms: unknown {', '.join(unknown)} (known: {', '.join(ARMS)})")
    probed = probe(args)
    train_rows, eval_rows = split(probed, args)
    print(
        f"dataset: {len(probed)} candidates probed ({args.probe_samples} samples, T "
        f"{args.temperature}); {len(train_rows)} training and {len(eval_rows)} held-out "
        f"problems, a third of each level",
        flush=True,
    )
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-curriculum-") as tmp:
        train = write_jsonl(Path(tmp) / "train.jsonl", train_rows)
        evals = write_jsonl(Path(tmp) / "eval.jsonl", eval_rows)
        for seed in [int(s) for s in args.seeds.split(",")]:
            base = shared_settings(args, train, evals, seed)
            for arm in arms:  # alternating arms within a seed: load drifts equally on each
                runs.append(run_arm(args, arm, base, Path(tmp) / f"{arm}-{seed}"))
                r = runs[-1]
                print(
                    f"seed {seed} {arm:17s} zero-signal/trained {r['zero_per_trained']:.2f} "
                    f"generated/trained {r['generated_per_trained']:.2f} skipped {r['skipped']} "
                    f"wall {r['wall_s']:.0f}s held-out reward {r['curve'][0][1]:.3f} -> "
                    f"{r['curve'][-1][1]:.3f}",
                    flush=True,
                )
    table = summarise(runs, arms)
    t = next(iter(table.values()))["equal_time_s"]
    print(f"\nat equal wall time {t:.0f} s (the shortest run's last evaluation):")
    print(
        "| run | zero-signal / trained | generated / trained | skipped | held-out reward at "
        "equal time | mean until then | wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    for arm, row in table.items():
        print(
            f"| {arm} | {row['zero_per_trained']:.2f} | {row['generated_per_trained']:.2f} | "
            f"{row['skipped']:.0f} | {row['reward_at_equal_time']:.3f} | "
            f"{row['reward_mean_until']:.3f} | {row['wall_s']:.0f} |"
        )
    dataset = {"train": train_rows, "eval": eval_rows}
    record = {"args": vars(args), "table": table, "runs": runs, "dataset": dataset}
    save_json(results_path(f"{args.name}.json"), {**record, "environment": environment()})
    u, c = table.get("uniform"), table.get("curriculum")
    ratio = u["zero_per_trained"] / max(c["zero_per_trained"], 1e-9) if u and c else float("nan")
    rewards = " ".join(f"{a} {row['reward_at_equal_time']:.3f}" for a, row in table.items())
    print(
        f"zero-signal per trained uniform/curriculum {ratio:.2f}, held-out reward at equal "
        f"time {rewards}"
    )


if __name__ == "__main__":
    main()
