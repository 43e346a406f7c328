"""A generative judge against a rule-based reward: scores/s, agreement, the trainer's wait.

1. In one process: the shipped tiny judge (`name = "judge"`, grpo-stream/tiny-judge, greedy
   hf generate, batched) and exact_match score the same groups of arith answers (right ones
   and the kinds of wrong ones a policy writes): groups/s of each, and how often the judge's
   verdict equals exact_match's.
2. Real `grpo-stream up` runs of the tiny model, equal but for the reward: exact_match with
   one scorer; the judge with one scorer; the judge with --judge-scorers scorers (judges scale
   out as scorers do). Per run: the trainer's mean wait per step (trainer_wait_s, steps
   2..N), the generators' tokens/s (equal generator settings; the machine's cores are shared),
   steps/s and reward.

Goal (issue 38): the trainer's wait with the judge at most 1.2x the rule-based reward's.
Run: python -m bench.judge [--steps 40] [--judge-scorers 2]
--smoke: part 1 on a few groups (seconds), nothing saved.
Last line: `judge scores/s J vs rule R; trainer wait judge/rule W (x S scorers: W2)`.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
import time
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

JUDGE_MODEL = "grpo-stream/tiny-judge"
RULE = '[{name = "exact_match"}]'
JUDGE = f'[{{name = "judge", path = "{JUDGE_MODEL}", params = {{device = "cpu"}}}}]'


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="generative judge vs rule-based reward")
    parser.add_argument("--steps", type=int, default=40, help="trainer steps of each real run")
    parser.add_argument("--groups", type=int, default=64, help="groups scored in process")
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--judge-scorers", type=int, default=2, help="scorers of the 3rd run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per real run")
    parser.add_argument("--smoke", action="store_true", help="part 1 on a few groups only")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    return parser


def answers(rng: random.Random, groups: int, size: int) -> list[tuple[str, list[str], str]]:
    """(prompt, G completions, reference answer): half right, half wrong the ways a policy
    errs (the judge's training distribution, drawn with another seed)."""
    from grpo_stream.builds.judge import wrong_answer

    out = []
    for _ in range(groups):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        comps = [
            str(a + b) if rng.random() < 0.5 else wrong_answer(rng, a + b) for _ in range(size)
        ]
        out.append((f"{a}+{b}=", comps, str(a + b)))
    return out


def in_process(args: argparse.Namespace) -> dict[str, Any]:
    """Groups/s of the judge and of exact_match on the same groups; their agreement."""
    from grpo_stream.rewards.builtin import exact_match
    from grpo_stream.rewards.judge import Judge

    data = answers(random.Random(args.seed + 7), args.groups, args.group_size)
    judge = Judge.load(JUDGE_MODEL, device="cpu", batch_size=args.group_size, cache_size=0)
    judge.score_batch(["1"], prompt="1+0=", reference={})  # warm-up: first call's allocations
    t0 = time.perf_counter()
    verdicts = [judge.score_batch(c, prompt=p, reference={"answer": r}) for p, c, r in data]
    judge_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rules = [[exact_match(x, prompt=p, reference={"answer": r}) for x in c] for p, c, r in data]
    rule_s = time.perf_counter() - t0
    pairs = [
        (v, r) for vs, rs in zip(verdicts, rules, strict=True) for v, r in zip(vs, rs, strict=True)
    ]
    agree = sum(isinstance(v, float) and v == r for v, r in pairs) / len(pairs)
    unparsed = sum(not isinstance(v, float) for v, _ in pairs)
    return {
        "groups": args.groups,
        "group_size": args.group_size,
        "judge_groups_per_s": args.groups / judge_s,
        "rule_groups_per_s": args.groups / max(rule_s, 1e-9),
        "agreement": agree,
        "unparseable": unparsed,
    }


def run_summary(name: str, run_dir: Path) -> dict[str, Any]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows.sort(key=lambda r: int(r["step"]))
    waits = [float(r["trainer_wait_s"]) for r in rows[1:]]
    wall = [float(r["wall_time"]) for r in rows]
    rewards = [r["reward_mean"] for r in rows if r["reward_mean"] is not None]
    return {
        "name": name,
        "wait_per_step_s": float(np.mean(waits)),
        "steps_per_s": (len(rows) - 1) / (wall[-1] - wall[0]),
        "gen_tokens_per_s": float(np.mean([r["tokens_per_s"] for r in rows[1:]])),
        "reward_first10": float(np.mean(rewards[:10])),
        "reward_last10": float(np.mean(rewards[-10:])),
        "trainer_wait_s": [float(r["trainer_wait_s"]) for r in rows],
    }


def real_runs(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, Any], dict[str, str]]:
    base = [
        f"model.name_or_path={json.dumps(TINY_MODEL)}",
        f"generator.group_size={args.group_size}",
        f"run.seed={args.seed}",
        f"trainer.checkpoint_every={args.steps}",
        "scorer.timeout_s=30",
        # every group trained, as in bench.common: a step is the same work whatever the
        # reward says (a judge that calls more groups all right would otherwise make steps
        # wait for refills, and the wait would measure the verdicts, not the judge's cost)
        "algo.advantage.filter_zero_signal=false",
    ]
    plan = {
        "rule": [f"task.rewards={RULE}", "scorer.count=1"],
        "judge": [f"task.rewards={JUDGE}", "scorer.count=1"],
        f"judge_x{args.judge_scorers}": [
            f"task.rewards={JUDGE}",
            f"scorer.count={args.judge_scorers}",
        ],
    }
    out: dict[str, Any] = {}
    commands: dict[str, str] = {}
    for name, extra in plan.items():
        run_dir = tmp / name
        commands[name] = " ".join(up_command(run_dir, args.steps, [*base, *extra]))
        run_pipeline(name, run_dir, args.steps, [*base, *extra], timeout_s=args.timeout)
        out[name] = run_summary(name, run_dir)
    return out, commands


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.smoke:
        args.groups = min(args.groups, 4)
    scores = in_process(args)
    judge_rate, rule_rate = scores["judge_groups_per_s"], scores["rule_groups_per_s"]
    print(
        f"in process: judge {fmt(judge_rate, 1)} groups/s, exact_match {fmt(rule_rate, 0)} "
        f"groups/s (G={args.group_size}); agreement {fmt(scores['agreement'], 3)}, "
        f"unparseable {scores['unparseable']}"
    )
    if args.smoke:
        print(
            f"judge scores/s {fmt(judge_rate * args.group_size, 1)} vs rule "
            f"{fmt(rule_rate * args.group_size, 0)}; trainer wait judge/rule n/a (smoke)"
        )
        return
    with tempfile.TemporaryDirectory(prefix="bench-judge-") as tmp:
        runs, commands = real_runs(args, Path(tmp))
    for r in runs.values():
        print(
            f"{r['name']:9s} wait/step {fmt(r['wait_per_step_s'], 3)} s  steps/s "
            f"{fmt(r['steps_per_s'], 3)}  gen tokens/s {fmt(r['gen_tokens_per_s'], 0)}  reward "
            f"first10 {fmt(r['reward_first10'])} last10 {fmt(r['reward_last10'])}"
        )
    rule_wait = runs["rule"]["wait_per_step_s"]
    wait1 = runs["judge"]["wait_per_step_s"] / rule_wait
    scaled = runs[f"judge_x{args.judge_scorers}"]["wait_per_step_s"] / rule_wait
    if not args.no_save:
        path = save_json(RESULTS_DIR / "judge.json", {
            "args": vars(args), "commands": commands, "env": environment(),
            "in_process": scores, "runs": runs,
        })  # fmt: skip
        print(f"saved {path.relative_to(REPO_ROOT)}")
    print(
        f"judge scores/s {fmt(judge_rate * args.group_size, 1)} vs rule "
        f"{fmt(rule_rate * args.group_size, 0)}; trainer wait judge/rule {fmt(wait1)} "
        f"(x {args.judge_scorers} scorers: {fmt(scaled)})"
    )


if __name__ == "__main__":
    main()
