"""bench.vllm_stream's `up` part: whole `grpo-stream up` runs (the shipped tiny model on
arith, default settings, `--up-steps` trainer steps) with `generator.engine = "vllm"` and
with the hf engine, and, given `--before DIR`, with the vllm engine as it was before it
streamed.

- `vllm`: this checkout (the streaming AsyncLLM engine).
- `hf`: this checkout, `generator.engine = "hf"` (reward should rise alike).
- `vllm-before`: DIR, a checkout of the code before the streaming engine (for example
  `git worktree add DIR <commit>`), run with DIR as the working directory, so its
  `grpo_stream` comes first on sys.path (before the installed one) in every service it
  starts. `VLLM_PLUGINS` names no plugin there: the installed grpo-stream's plugin module
  does not exist in that code.
Every side gets `generator.gpu_memory_utilization` 0.05 (on a CPU host it is a share of RAM)
and the same seed. Measured: steady steps/s and completion tokens/s (steps 2..N), the mean
reward of the first and last 5 steps, and wall time with start-up.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import series_from_metrics, up_command

WINDOW = 5  # steps averaged at each end for the reward
OVERRIDES = ["generator.gpu_memory_utilization=0.05", "run.seed=0"]


def up(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One `up` run per side; their summaries and the load each ran under."""
    sides: dict[str, tuple[str, Path | None]] = {"vllm": ("vllm", None), "hf": ("hf", None)}
    if args.before is not None:
        sides["vllm-before"] = ("vllm", args.before.resolve())
    rows: dict[str, Any] = {}
    for name, (engine, tree) in sides.items():
        load = os.getloadavg()[0]
        overrides = [f"generator.engine={engine}", *OVERRIDES]
        series = run_up(name, tmp / f"up-{name}", args.up_steps, overrides, tree)
        rows[name] = {**series.summary(WINDOW), "load": load, "rewards": series.rewards}
        print(f"up {name}: " + ", ".join(f"{k} {v:.3g}" for k, v in rows[name].items()
                                         if k != "rewards"), flush=True)  # fmt: skip
    return {"sides": rows, "window": WINDOW}


def run_up(name: str, run_dir: Path, steps: int, overrides: list[str], tree: Path | None) -> Any:
    """`grpo-stream up` to completion in `tree` (None: this checkout); its StepSeries."""
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = up_command(run_dir, steps, overrides)
    cwd = tree or Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    if tree is not None:
        env["VLLM_PLUGINS"] = "none"  # the installed plugin's module is not in that code
    print(f"$ (cd {cwd}) " + " ".join(argv), flush=True)
    start = time.perf_counter()
    with (run_dir / "up.log").open("w") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, cwd=cwd,
                                env=env)  # fmt: skip
        try:
            code = proc.wait(timeout=3600)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the launcher stops its services cleanly
            code = proc.wait(timeout=120)
    metrics = run_dir / "metrics.jsonl"
    series = series_from_metrics(name, metrics, time.perf_counter() - start) if (
        metrics.exists()) else None  # fmt: skip
    if code != 0 or series is None or len(series.steps) < steps:
        tail = (run_dir / "up.log").read_text(errors="replace").splitlines()[-20:]
        raise RuntimeError(f"up {name} exited with {code}:\n" + "\n".join(tail))
    return series


def report(result: dict[str, Any]) -> None:
    sides = result["sides"]
    for name, row in sides.items():
        first, last = row[f"reward_first{WINDOW}"], row[f"reward_last{WINDOW}"]
        print(f"up {name}: steps/s {row['steps_per_s']:.3g}, reward {first:.3f} -> {last:.3f}")
    if "vllm-before" in sides:
        ratio = sides["vllm"]["steps_per_s"] / sides["vllm-before"]["steps_per_s"]
        print(f"up steps/s vllm/vllm-before {ratio:.2f}")
