"""On-policy distillation against rewards: the student's pass@1 against steps, three ways.

1. The teacher: the default run's trained checkpoint (`grpo-stream up` on the tiny model for
   --teacher-steps steps, arith with task.holdout, so its held-out prompts stay unseen), or
   --teacher PATH.
2. Three student runs from the shipped tiny model (warm-started, never GRPO-trained), equal but
   for the advantage: distill (algo.distill.weight = 1: the teacher's per-token reverse KL
   alone), reward (no teacher: GRPO on exact_match), both (weight = 0.5). A checkpoint every
   --eval-every steps.
3. pass@1 of every checkpoint (and of the start) on the same held-out problems, same samples
   and sampling seed (`grpo_stream.evaluation.evaluate`), per --seeds (run.seed and
   task.seed), averaged over seeds.

Goal (issue 38): distillation reaches the reward-only run's final pass@1 in at most half its
steps. Run: python -m bench.distill [--steps 60] [--teacher-steps 200] [--seeds 0 1]
--smoke: the three configs validated, the teacher engine and the evaluation on a handful of
problems (seconds); nothing trained, nothing saved.
Last line: `distill reaches reward's final pass@1 P at step S of T (S/T = R); both at step B`.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

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
from grpo_stream.config import load_config

MODES = {"distill": 1.0, "reward": None, "both": 0.5}
"""Each student run's algo.distill.weight (None: no teacher)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="on-policy distillation vs rewards")
    parser.add_argument("--steps", type=int, default=60, help="trainer steps of each student")
    parser.add_argument("--eval-every", type=int, default=5, help="steps between checkpoints")
    parser.add_argument("--teacher-steps", type=int, default=200, help="the teacher's run")
    parser.add_argument("--teacher", default=None, help="a teacher checkpoint to use instead")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--holdout", type=float, default=0.1, help="task.holdout")
    parser.add_argument("--problems", type=int, default=128, help="held-out problems")
    parser.add_argument("--samples", type=int, default=8, help="samples per problem")
    parser.add_argument("--lr", type=float, default=1e-4, help="trainer.lr of every run")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--smoke", action="store_true", help="configs, engine, eval only")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    return parser


def common(args: argparse.Namespace, seed: int) -> list[str]:
    return [
        f"model.name_or_path={json.dumps(TINY_MODEL)}",
        f"task.holdout={args.holdout}",
        f"task.seed={seed}",
        f"run.seed={seed}",
        f"trainer.lr={args.lr}",
    ]


def student_overrides(args: argparse.Namespace, mode: str, teacher: str, seed: int) -> list[str]:
    sets = [
        *common(args, seed),
        f"trainer.checkpoint_every={args.eval_every}",
        f"trainer.keep_checkpoints={args.steps // args.eval_every + 1}",
    ]
    weight = MODES[mode]
    if weight is not None:
        sets += [f"algo.distill.teacher={json.dumps(teacher)}", f"algo.distill.weight={weight}"]
    return sets


def pass_at_1(model: str, args: argparse.Namespace, seed: int) -> float:
    from grpo_stream.evaluation import evaluate

    task = load_config(None, common(args, seed)).task
    result = evaluate(model, task, samples=args.samples, problems=args.problems, seed=seed)
    return float(result.pass_at_1)


def curve(run_dir: Path, args: argparse.Namespace, seed: int, start: float) -> list[float]:
    """pass@1 at step 0 (`start`), eval_every, 2 x eval_every, ... up to --steps."""
    points = [start]
    for step in range(args.eval_every, args.steps + 1, args.eval_every):
        points.append(pass_at_1(str(run_dir / "checkpoints" / f"step-{step}"), args, seed))
    return points


def train_teacher(args: argparse.Namespace, tmp: Path) -> tuple[str, str]:
    """(the teacher's checkpoint, the command that trained it)."""
    if args.teacher is not None:
        return args.teacher, "given"
    run_dir = tmp / "teacher"
    sets = [*common(args, 0), f"trainer.checkpoint_every={args.teacher_steps}"]
    run_pipeline("teacher", run_dir, args.teacher_steps, sets, timeout_s=args.timeout)
    return str(run_dir / "checkpoints" / f"step-{args.teacher_steps}"), " ".join(
        up_command(run_dir, args.teacher_steps, sets)
    )


def reached(points: list[float], target: float, every: int) -> int | None:
    """The first step whose pass@1 is at least `target` (None: never)."""
    for i, value in enumerate(points):
        if value >= target - 1e-9:
            return i * every
    return None


def smoke(args: argparse.Namespace) -> None:
    """The three configs load; the teacher scores a group; the evaluation runs on a few."""
    from grpo_stream.engines.distill import HFTeacher
    from grpo_stream.models.loading import load_tokenizer

    for mode in MODES:
        load_config(None, student_overrides(args, mode, TINY_MODEL, 0))
    tok = load_tokenizer(TINY_MODEL)
    prompt = np.array(tok("3+4=")["input_ids"], np.int32)
    comp = np.array([*tok("7", add_special_tokens=False)["input_ids"], tok.eos_token_id] * 4)
    t0 = time.perf_counter()
    lp = HFTeacher.load(TINY_MODEL, device="cpu").logprobs(
        prompt, comp.astype(np.int32), np.arange(0, 9, 2, dtype=np.int64), 1.0
    )
    seconds = time.perf_counter() - t0
    args.problems, args.samples = 4, 2
    p = pass_at_1(TINY_MODEL, args, 0)
    print(f"smoke: configs ok; teacher scored {lp.size} tokens in {seconds:.2f} s; pass@1 {p:.2f}")
    print("distill reaches reward's final pass@1 (smoke: nothing trained)")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.steps % args.eval_every:
        raise SystemExit("--steps must be a multiple of --eval-every")
    if args.smoke:
        smoke(args)
        return
    curves: dict[str, list[list[float]]] = {mode: [] for mode in MODES}
    commands: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-distill-") as tmp:
        teacher, commands["teacher"] = train_teacher(args, Path(tmp))
        teacher_p = {seed: pass_at_1(teacher, args, seed) for seed in args.seeds}
        for seed in args.seeds:
            start = pass_at_1(TINY_MODEL, args, seed)
            for mode in MODES:
                run_dir = Path(tmp) / f"{mode}-{seed}"
                sets = student_overrides(args, mode, teacher, seed)
                commands[f"{mode}-{seed}"] = " ".join(up_command(run_dir, args.steps, sets))
                run_pipeline(mode, run_dir, args.steps, sets, timeout_s=args.timeout)
                curves[mode].append(curve(run_dir, args, seed, start))
    mean = {mode: list(np.mean(np.array(c), axis=0)) for mode, c in curves.items()}
    steps = list(range(0, args.steps + 1, args.eval_every))
    print(f"teacher pass@1 {fmt(float(np.mean(list(teacher_p.values()))), 3)}; seeds {args.seeds}")
    print("step  " + "  ".join(f"{m:>7s}" for m in MODES))
    for i, step in enumerate(steps):
        print(f"{step:4d}  " + "  ".join(f"{mean[m][i]:7.3f}" for m in MODES))
    target = mean["reward"][-1]
    got = reached(mean["distill"], target, args.eval_every)
    both = reached(mean["both"], target, args.eval_every)
    if not args.no_save:
        path = save_json(RESULTS_DIR / "distill.json", {
            "args": vars(args), "commands": commands, "env": environment(),
            "teacher_pass_at_1": teacher_p, "steps": steps, "mean": mean, "curves": curves,
            "reward_final": target, "distill_reaches_at": got, "both_reaches_at": both,
        })  # fmt: skip
        print(f"saved {path.relative_to(REPO_ROOT)}")
    ratio = fmt(got / args.steps) if got is not None else "never"
    print(
        f"distill reaches reward's final pass@1 {fmt(target, 3)} at step "
        f"{got if got is not None else 'never'} of {args.steps} (S/T = {ratio}); both at step "
        f"{both if both is not None else 'never'}"
    )


if __name__ == "__main__":
    main()
