"""bench.time_to_reward's runs: ours (`grpo-stream up`) and TRL's GRPOTrainer (in a child
process of its own), each stopped at the task's wall budget from its launch, each read into a
`Curve`: per step, seconds from launch, mean reward, completions it covers.

- ours: `grpo-stream up` with the model and the dataset only (and the completion length
  where our default cannot hold the task's answer), run until the budget, then SIGTERM (a
  clean stop). A step's time is its `trainer.step` event's; its reward is metrics.jsonl's
  reward_mean, over the groups it trained and those filtered since the step before.
- trl: GRPOTrainer with TRL's defaults, given what a CPU run and the task need
  (`use_cpu`, `max_completion_length`) and a log line per step to read the reward from;
  `trl-matched`: bench.vs_trl's configuration (our G, 16 prompts a step, our learning rate,
  constant schedule, no gradient checkpointing). The reward is the one a TRL user writes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, up_command
from bench.time_to_reward_tasks import TaskSpec
from grpo_stream.config.trainer import TrainerSettings

OURS_STEPS = 100_000  # the budget ends our run, not a step count
STOP_WAIT_S = 60.0  # how long a run may take to stop cleanly after SIGTERM
SIDES = ("ours", "trl", "trl-matched")


@dataclass
class Curve:
    """One run's reward over time: per step, seconds from launch, mean reward, completions."""

    side: str
    seconds: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at launch and at the end

    def add(self, seconds: float, reward: float, count: int) -> None:
        self.seconds.append(seconds)
        self.rewards.append(reward)
        self.counts.append(count)


@dataclass(frozen=True)
class Job:
    """One run: the side, the task, its model and data, the seed."""

    side: str
    spec: TaskSpec
    model: str
    dataset: Path
    seed: int
    budget_s: float


def ours_overrides(job: Job) -> list[str]:
    """The model and the dataset; generator.max_tokens only where the task needs more."""
    sets = [
        f"model.name_or_path={json.dumps(job.model)}",
        'task.name="dataset"',
        f"task.dataset={json.dumps(str(job.dataset))}",
        f"run.seed={job.seed}",
    ]
    if job.spec.max_tokens != 8:
        sets.append(f"generator.max_tokens={job.spec.max_tokens}")
    return sets


def run_ours(job: Job, run_dir: Path, extra: list[str]) -> Curve:
    """`grpo-stream up` until the budget; its curve from metrics.jsonl and the trainer's log."""
    argv = up_command(run_dir, OURS_STEPS, [*ours_overrides(job), *extra])
    run_dir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    start = time.time()
    with (run_dir.parent / f"{run_dir.name}.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        stop_at_budget(proc, job.budget_s)
    curve = ours_curve(run_dir, start)
    curve.load = (load0, os.getloadavg()[0])
    return curve


def stop_at_budget(proc: subprocess.Popen[bytes], budget_s: float) -> int:
    """Wait for `proc` until `budget_s`; then SIGTERM (a clean stop), then kill."""
    try:
        return proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def ours_curve(run_dir: Path, start: float) -> Curve:
    """Per trained step: its end (the trainer's `trainer.step` event) from `start`, its mean
    reward and the completions it covers (trained and filtered since the step before)."""
    curve, filtered = Curve("ours"), 0
    log, metrics = run_dir / "logs" / "trainer-trainer-0.jsonl", run_dir / "metrics.jsonl"
    if not (log.exists() and metrics.exists()):
        return curve  # stopped before its first step
    ends: dict[int, float] = {}
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "trainer.step":
            ends[int(event["step"])] = float(event["t"]) - start
    group_size = int(
        tomllib.loads((run_dir / "config.toml").read_text())["generator"]["group_size"]
    )
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        groups = int(row["step_groups"]) + int(row["groups_filtered"]) - filtered
        filtered = int(row["groups_filtered"])
        if row["step"] in ends and row["reward_mean"] is not None:
            curve.add(ends[row["step"]], float(row["reward_mean"]), groups * group_size)
    return curve


def run_trl(job: Job, out: Path) -> Curve:
    """TRL in a child process (its imports count, as ours do), stopped at the budget."""
    spec = {
        "side": job.side,
        "model": job.model,
        "dataset": str(job.dataset),
        "seed": job.seed,
        "budget_s": job.budget_s,
        "start": time.time(),
        "max_tokens": job.spec.max_tokens,
        "reward": job.spec.trl_reward,
    }
    argv = [sys.executable, "-m", "bench.time_to_reward_runs", json.dumps(spec), str(out)]
    load0 = os.getloadavg()[0]
    with (out.parent / f"{out.stem}.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        stop_at_budget(proc, job.budget_s + STOP_WAIT_S)  # it stops itself at the budget
    curve = Curve(job.side)  # empty if it stopped before its first step
    if out.exists():
        data = json.loads(out.read_text())
        curve = Curve(job.side, data["seconds"], data["rewards"], data["counts"])
    curve.load = (load0, os.getloadavg()[0])
    return curve


# ---- the TRL child ----------------------------------------------------------------------


def math_verify_reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """What a TRL user writes for numeric answers: math_verify, as TRL's accuracy reward."""
    from math_verify import parse, verify

    return [float(verify(parse(a), parse(c))) for c, a in zip(completions, answer, strict=True)]


def exact_reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """What a TRL user writes for a choice: the answer's text, exactly."""
    return [float(c.strip() == a.strip()) for c, a in zip(completions, answer, strict=True)]


def trl_args(spec: dict[str, Any], out_dir: str) -> Any:
    """TRL's defaults (what a CPU run and the task need set), or bench.vs_trl's config."""
    from trl.trainer.grpo_config import GRPOConfig

    from bench.vs_trl_cell import trl_config

    if spec["side"] == "trl-matched":
        matched = argparse.Namespace(
            steps=OURS_STEPS,
            prompts_per_step=16,
            group_size=8,
            max_tokens=spec["max_tokens"],
            lr=TrainerSettings().lr,
            seed=spec["seed"],
        )
        return trl_config(matched, out_dir)
    return GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        seed=spec["seed"],
        max_completion_length=spec["max_tokens"],
        logging_steps=1,
        report_to="none",
    )


def trl_child(spec: dict[str, Any], out: Path) -> None:
    """Train with TRL until the budget (seconds from the parent's launch), writing the curve."""
    from datasets import load_dataset
    from transformers import TrainerCallback
    from trl.trainer.grpo_trainer import GRPOTrainer

    from grpo_stream.models.loading import load_policy, load_tokenizer

    curve, start, budget = Curve(spec["side"]), float(spec["start"]), float(spec["budget_s"])

    class Record(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                count = args.per_device_train_batch_size * args.gradient_accumulation_steps
                curve.add(time.time() - start, float(logs["reward"]), count)
                out.write_text(json.dumps(curve.__dict__))
            if time.time() - start >= budget:
                control.should_training_stop = True

    data = load_dataset("json", data_files=spec["dataset"])["train"]
    data = data.rename_column("question", "prompt")
    reward = math_verify_reward if spec["reward"] == "math_verify" else exact_reward
    with tempfile.TemporaryDirectory(prefix="bench-ttr-trl-") as tmp:
        trainer = GRPOTrainer(
            model=load_policy(spec["model"], dtype="float32", trainable=True),
            reward_funcs=[reward],
            args=trl_args(spec, tmp),
            train_dataset=data,
            processing_class=load_tokenizer(spec["model"]),
            callbacks=[Record()],
        )
        trainer.train()
    out.write_text(json.dumps(curve.__dict__))


if __name__ == "__main__":
    trl_child(json.loads(sys.argv[1]), Path(sys.argv[2]))
