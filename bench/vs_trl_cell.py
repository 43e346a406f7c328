"""One cell of bench.vs_trl: its options, TRL's side, ours, and the two run alternating.

A cell is one workload (model, task, completion length, G, steps); `run_cell` prepares its
model (the 10x build, the raised context), runs each side `--repeats` times, alternating, and
returns the median run of each side. bench.vs_trl runs one cell from its command line;
bench.vs_trl_matrix runs a list of them. What the two sides share and what still differs is
in bench.vs_trl's docstring.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    TINY_MODEL,
    StepSeries,
    add_set,
    environment,
    median_run,
    pipeline_overrides,
    run_pipeline,
    up_command,
)
from bench.vs_trl_model import count_parameters, model_10x, with_context

DEFAULT_LR = 2e-4  # trainer.lr's default
DEFAULT_MICRO_BATCH = 64  # trainer.micro_batch's default


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="grpo-stream vs TRL GRPOTrainer on the CPU")
    parser.add_argument("--steps", type=int, default=40, help="trainer steps of each run")
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--max-tokens", type=int, default=8, help="completion tokens at most")
    parser.add_argument("--lr", type=float, default=DEFAULT_LR)
    parser.add_argument("--model", default=TINY_MODEL, help="model name or path (tiny-arith)")
    parser.add_argument("--size", choices=["tiny", "10x"], default="tiny")
    parser.add_argument("--sft-steps", type=int, default=200, help="10x: SFT warm-start cap")
    parser.add_argument(
        "--keep-10x", type=Path, default=None, metavar="DIR",
        help="10x: build the model into DIR once and reuse it on later runs (same seed, steps)",
    )  # fmt: skip
    parser.add_argument("--task", choices=["arith", "countdown"], default="arith")
    parser.add_argument(
        "--context", type=int, default=0,
        help="raise the model's context to this many positions (countdown's prompts need 512)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=threads_arg, default="auto", help="ours: run.torch_threads (auto, or N)"
    )
    parser.add_argument(
        "--trl-threads", type=int, default=None, help="TRL's torch threads (default: all cores)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--last-k", type=int, default=20, help="K of the reward means")
    example = "e.g. algo.loss.logprob_chunk=64"
    add_set(parser, "ours_set", f"extra setting for our pipeline only (repeatable), {example}")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs per side")
    parser.add_argument("--only", choices=["both", "ours", "trl"], default="both")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for our run")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    return parser


def check_args(args: argparse.Namespace) -> None:
    if args.steps < 2:
        raise SystemExit("--steps must be at least 2 (rates are measured from step 2)")
    if args.group_size < 2:
        raise SystemExit("--group-size must be at least 2 (TRL needs two generations)")
    if min(args.prompts_per_step, args.max_tokens, args.last_k, args.repeats) < 1:
        raise SystemExit("--prompts-per-step, --max-tokens, --last-k, --repeats must be >= 1")
    if args.trl_threads is not None and args.trl_threads < 1:
        raise SystemExit("--trl-threads must be >= 1")


def threads_arg(text: str) -> int | str:
    """--threads: "auto" or a whole number >= 1."""
    if text == "auto":
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(f'expected "auto" or a whole number >= 1, got {text!r}')


def trl_threads(args: argparse.Namespace) -> int:
    """TRL's torch threads: --trl-threads, else every core this process may use (torch's
    own default on a machine to itself)."""
    return args.trl_threads or len(os.sched_getaffinity(0))


# ---- TRL ----------------------------------------------------------------------------------


def load_problems(n: int, task_name: str) -> list[Any]:
    """The first `n` problems of the task, in order (what our hub dispatches)."""
    from grpo_stream.config.tasks import TaskSettings
    from grpo_stream.tasks import make_task

    task = make_task(TaskSettings(name=task_name))
    return [task.problem(i) for i in range(n)]


def trl_reward(task_name: str) -> Callable[..., list[float | None]]:
    """The task's rewards (exact_match for arith, countdown's for countdown), combined as
    our scorer combines them, as a TRL reward function (references travel as JSON)."""
    from grpo_stream.config.tasks import TaskSettings
    from grpo_stream.rewards import load_reward
    from grpo_stream.rewards.registry import combine, reward_specs
    from grpo_stream.tasks import make_task

    settings = TaskSettings(name=task_name)
    specs = reward_specs(settings, make_task(settings))
    fns = [load_reward(spec) for spec in specs]

    def task_reward(
        prompts: list[str], completions: list[str], reference: list[str], **_: Any
    ) -> list[float | None]:
        out: list[float | None] = []
        for p, c, r in zip(prompts, completions, reference, strict=True):
            ref = json.loads(r)
            out.append(combine([float(fn(c, prompt=p, reference=ref)) for fn in fns], specs))
        return out

    return task_reward


def trl_config(args: argparse.Namespace, output_dir: str) -> Any:
    from trl.trainer.grpo_config import GRPOConfig

    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    # transformers 5 renamed gradient_checkpointing (GRPOConfig's default: on)
    key = "activation_checkpointing"
    no_checkpointing: dict[str, Any] = {key if key in fields else "gradient_checkpointing": False}
    per_step = args.prompts_per_step * args.group_size
    micro = min(DEFAULT_MICRO_BATCH, per_step)
    if per_step % micro:
        micro = per_step
    return GRPOConfig(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=per_step // micro,  # generation batch = prompts x G
        num_generations=args.group_size,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        optim="adamw_torch",
        beta=0.0,
        loss_type="grpo",
        epsilon=0.2,
        epsilon_high=0.28,
        scale_rewards="group",
        num_iterations=1,
        use_cpu=True,
        bf16=False,
        fp16=False,
        **no_checkpointing,
        shuffle_dataset=False,
        remove_unused_columns=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=args.seed,
        data_seed=args.seed,
        dataloader_num_workers=0,
    )


def make_recorder(series: StepSeries, rollouts_per_step: int) -> Any:
    """A TrainerCallback filling `series` with per-step time, reward and completion tokens."""
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        t0 = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            series.steps.append(int(state.global_step))
            series.wall_s.append(time.perf_counter() - self.t0)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs and len(series.rewards) < len(series.steps):
                series.rewards.append(float(logs["reward"]))
                length = float(logs.get("completions/mean_length", math.nan))
                series.completion_tokens.append(length * rollouts_per_step)
                series.extra.setdefault("step_time", []).append(float(logs.get("step_time", -1)))

    return Recorder()


def run_trl(args: argparse.Namespace, model_path: str) -> tuple[StepSeries, dict[str, Any]]:
    start = time.perf_counter()
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl.trainer.grpo_trainer import GRPOTrainer

    from grpo_stream.models.loading import load_policy, load_tokenizer

    torch.set_num_threads(trl_threads(args))
    torch.manual_seed(args.seed)
    problems = load_problems(args.steps * args.prompts_per_step, args.task)
    dataset = Dataset.from_dict(
        {
            "prompt": [p.prompt for p in problems],
            "reference": [json.dumps(dict(p.reference)) for p in problems],
        }
    )
    series = StepSeries(name="TRL GRPOTrainer")
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as out:
        config = trl_config(args, out)
        trainer = GRPOTrainer(
            model=load_policy(model_path, dtype="float32", trainable=True),
            reward_funcs=[trl_reward(args.task)],
            args=config,
            train_dataset=dataset,
            processing_class=load_tokenizer(model_path),
            callbacks=[make_recorder(series, args.prompts_per_step * args.group_size)],
        )
        trainer.remove_callback(PrinterCallback)  # the per-step log dicts; the summary says it
        trainer.train()
    series.total_s = time.perf_counter() - start
    keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
            "steps_per_generation", "num_generations", "max_completion_length", "learning_rate",
            "lr_scheduler_type", "loss_type", "beta", "epsilon", "epsilon_high", "max_grad_norm",
            "use_cpu", "bf16", "gradient_checkpointing", "shuffle_dataset", "optim")  # fmt: skip
    return series, {k: getattr(config, k) for k in keys}


# ---- ours, and the cell -------------------------------------------------------------------


def run_ours(args: argparse.Namespace, model_path: str, run_dir: Path) -> StepSeries:
    overrides = ours_overrides(args, model_path)
    return run_pipeline("grpo-stream", run_dir, args.steps, overrides, timeout_s=args.timeout)


def ours_overrides(args: argparse.Namespace, model_path: str) -> list[str]:
    same = pipeline_overrides(
        model=model_path, group_size=args.group_size, prompts_per_step=args.prompts_per_step,
        max_tokens=args.max_tokens, lr=args.lr, threads=args.threads, seed=args.seed,
        steps=args.steps,
    )  # fmt: skip
    task = [] if args.task == "arith" else [f"task.name={json.dumps(args.task)}"]
    return [*same, *task, 'algo.loss.aggregation="grpo"', "algo.loss.beta=0.0", *args.ours_set]


def run_sides(
    args: argparse.Namespace, model_path: str, tmp: Path, result: dict[str, Any]
) -> list[StepSeries]:
    """Each side `--repeats` times, alternating (the machine's load drifts); per side, the
    run with the median steps/s. Every repeat's steps/s goes into `result`."""
    sides: dict[str, list[StepSeries]] = {"ours": [], "trl": []}
    for repeat in range(args.repeats):
        if args.only in ("both", "ours"):
            run_dir = tmp / f"ours-{repeat}"
            command = up_command(run_dir, args.steps, ours_overrides(args, model_path))
            result["ours_command"] = " ".join(command)
            sides["ours"].append(run_ours(args, model_path, run_dir))
        if args.only in ("both", "trl"):
            series, result["trl_config"] = run_trl(args, model_path)
            sides["trl"].append(series)
    result["repeats_steps_per_s"] = {
        side: [s.steps_per_s() for s in runs] for side, runs in sides.items() if runs
    }
    if args.repeats > 1:
        print(f"steps/s of every repeat: {json.dumps(result['repeats_steps_per_s'])}")
    return [median_run(runs) for runs in sides.values() if runs]


def recorded_args(args: argparse.Namespace) -> dict[str, Any]:
    """The options as the results JSON holds them (paths as text: --keep-10x)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def cell_model(args: argparse.Namespace, tmp: Path) -> tuple[str, dict[str, Any]]:
    """The cell's model path and what is known of it: --model, or the 10x model built for
    --size 10x, then a copy with its context raised to --context where it is shorter."""
    model_path, model_info = args.model, {"path": args.model}
    if args.size == "10x":
        model_info = model_10x(args, tmp)
        model_path = model_info["path"]
        print(f"10x model: {json.dumps(model_info)}", flush=True)
    if args.context:
        model_path = with_context(model_path, tmp / "model-long", args.context)
        model_info["context"] = args.context
    model_info.setdefault("parameters", count_parameters(model_path))
    return model_path, model_info


def run_cell(args: argparse.Namespace) -> tuple[list[StepSeries], dict[str, Any]]:
    """Both sides of one cell (each side's median run: ours first, then TRL's) and the
    result record (args, model, environment, threads, every repeat's steps/s)."""
    with tempfile.TemporaryDirectory(prefix="bench-vs-trl-") as tmp:
        model_path, model_info = cell_model(args, Path(tmp))
        result: dict[str, Any] = {
            "args": recorded_args(args), "model": model_info, "env": environment()
        }  # fmt: skip
        result["threads"] = {"ours": args.threads, "trl": trl_threads(args)}
        print(f"threads: ours run.torch_threads={args.threads}, TRL {trl_threads(args)}")
        runs = run_sides(args, model_path, Path(tmp), result)
    return runs, result
