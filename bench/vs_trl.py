"""grpo-stream vs TRL's GRPOTrainer: the same GRPO work on the CPU, steps/s and reward side by side.

Both sides get the same model, task, prompts in the same order (prompt i is
`task.problem(i).prompt`; TRL's dataset is the first steps x prompts-per-step problems, in
order, not shuffled), group size G, at most 8 completion tokens, temperature 1.0 (no top-k,
top-p 1.0), learning rate (constant, no warm-up), AdamW (weight decay 0), beta = 0 (no
reference model), per-sequence-mean loss aggregation (`loss_type="grpo"`, ours
`algo.loss.aggregation="grpo"`), clip range 0.2 / 0.28, group-std advantages, the whole
machine (ours `run.torch_threads="auto"`: trainer and generator split the cores, each pinned
to its own; TRL: torch threads = every core), number of steps and prompts per step; fp32 on
the CPU. `--task countdown --max-tokens 128 --context 512` is the long-completion workload
(completion lengths vary; both sides score with the task's own rewards; the countdown
prompts, ~295 tokens with the tiny tokenizer, need the model's context raised: `--context`,
see bench/vs_trl_model.py `with_context`).

(a) ours: `grpo-stream up` as a child process, every group trained (no zero-signal filtering,
    as TRL), hub.max_staleness 1 (the default: asynchronous).
(b) TRL: `GRPOTrainer` in this process with `use_cpu=True`, fp32, no gradient checkpointing,
    one `generate` call per step (generation batch = prompts x G, micro-batches of
    `trainer.micro_batch` with gradient accumulation, so one optimizer step per generation),
    our exact_match reward wrapped as a TRL reward function, a TrainerCallback recording
    per-step time and reward.

What still differs, by design of each: TRL samples with `model.generate`, ours with its own
KV-cache loop; TRL clips the gradient norm at 1.0 (its default), ours applies its adaptive
regularizer; ours runs generation and training in separate processes at the same time
(their threads from `--threads`), TRL alternates them in one process (`--trl-threads`).

Rates are steady (steps 2..N, see bench/common.py). `--size 10x` builds, deterministically
and in a temporary directory, a Qwen2 with the tiny model's tokenizer and about 10x its
parameters (hidden and heads x2, layers x2.5), randomly initialised and then warm-started
with the tiny model's own SFT recipe for at most --sft-steps steps; the point is speed at 10x
parameters: its reward may stay near 0.

The options, both sides and the model of one run: bench/vs_trl_cell.py.

Run: python -m bench.vs_trl [--steps 40] [--size tiny|10x]
Last line: `ratio ours/trl steps/s: R (reward lastK ours A trl B)`.

`--matrix` runs the workload matrix instead (bench/vs_trl_matrix.py: cells of other models,
prompt and completion lengths and G); `--smoke` is its smoke run.
"""

from __future__ import annotations

import argparse

from bench.common import (
    REPO_ROOT,
    RESULTS_DIR,
    StepSeries,
    add_smoke,
    fmt,
    parse,
    plot_rewards,
    save_json,
)
from bench.vs_trl_cell import build_parser as cell_parser
from bench.vs_trl_cell import check_args, run_cell
from bench.vs_trl_matrix import add_options, run_matrix
from bench.vs_trl_model import build_10x as build_10x  # re-exported: other benches
from bench.vs_trl_model import count_parameters as count_parameters  # re-exported

SMOKE = ["--matrix"]
"""--smoke is the matrix's smoke run (bench/vs_trl_matrix.py)."""


def build_parser() -> argparse.ArgumentParser:
    """One cell's options (bench/vs_trl_cell.py), the matrix's, and --smoke."""
    parser = cell_parser()
    add_options(parser)
    add_smoke(parser)
    return parser


def print_summary(series: list[StepSeries], k: int) -> None:
    for s in series:
        print(
            f"{s.name:16s} steps/s {fmt(s.steps_per_s(), 3)}  completion tokens/s "
            f"{fmt(s.tokens_per_s(), 0)}  reward first{k} {fmt(s.reward_first(k))} "
            f"last{k} {fmt(s.reward_last(k))}  steps {len(s.steps)}  wall {fmt(s.total_s, 1)} s"
        )


def final_line(ours: StepSeries, trl: StepSeries, k: int) -> str:
    ratio = ours.steps_per_s() / trl.steps_per_s()
    tokens = ours.tokens_per_s() / trl.tokens_per_s()
    print(f"ratio ours/trl completion tokens/s: {fmt(tokens)}")
    return (
        f"ratio ours/trl steps/s: {fmt(ratio)} (reward last{k} ours "
        f"{fmt(ours.reward_last(k))} trl {fmt(trl.reward_last(k))})"
    )


def result_name(args: argparse.Namespace) -> str:
    """vs_trl_SIZE, with the task and completion length when they are not the defaults."""
    workload = (
        "" if (args.task, args.max_tokens) == ("arith", 8) else f"_{args.task}{args.max_tokens}"
    )
    return f"vs_trl_{args.size}{workload}"


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse(parser, argv, SMOKE)
    if args.matrix:
        run_matrix(args, parser)
        return
    check_args(args)
    k = min(args.last_k, args.steps)
    runs, result = run_cell(args)
    print_summary(runs, k)
    result["summary"] = {s.name: s.summary(k) for s in runs}
    result["series"] = [s.to_json() for s in runs]
    if not args.no_save:
        stem = RESULTS_DIR / result_name(args)
        title = (
            f"GRPO on {args.task}, {result['model']['parameters'] / 1e6:.1f}M params, "
            f"{args.max_tokens} tokens, CPU"
        )
        plot_rewards(stem.with_suffix(".png"), runs, title)
        save_json(stem.with_suffix(".json"), result)
        print(f"saved {stem.relative_to(REPO_ROOT)}.json/.png")
    if len(runs) == 2:
        print(final_line(runs[0], runs[1], k))


if __name__ == "__main__":
    main()
