"""Shared helpers of the benchmarks that put grpo-stream beside other setups.

- `run_pipeline` runs our whole pipeline (`grpo-stream up`) as a child process, tracked by
  pid (SIGTERM on timeout, so the launcher stops its services cleanly), and reads the run's
  metrics.jsonl into a `StepSeries`.
- `StepSeries` holds one row per trainer step, in step order: seconds from the start of
  training to the end of the step, mean reward, completion tokens trained. Rates are
  "steady": steps 2..N over the time from the end of step 1 to the end of step N, so model
  loading, process start-up and the first step's warm-up count for neither side; the
  end-to-end wall time (start-up included) is kept beside them.
- Results are written as JSON and PNG under bench/results (small files, kept in git).
- Every bench has `--smoke` (`parse`): its smallest run of every side, in seconds, whose
  results go to a temporary directory (`results_path`), never to bench/results. The test
  suite runs each bench this way, so a bench that no longer runs fails a test.

Run the benchmarks from the repository root as modules: `python -m bench.vs_trl ...`.
Nothing here runs at import time; matplotlib is imported inside `plot_rewards`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_stream.jsonl import read_rows

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "bench" / "results"
EXTRA_METRICS = ("step_seconds", "trainer_wait_s", "staleness_mean")
"""metrics.jsonl columns kept beside the main series: where a step's time went."""
TINY_MODEL = "grpo-stream/tiny-arith"
"""Name of the shipped tiny model (resolved to grpo_stream/assets/tiny-arith)."""
SMOKE_HELP = (
    "a run of seconds: the smallest size of every side, results in a temporary directory "
    "(the test suite runs every bench so)"
)
_smoke_dir: Path | None = None
"""Where a --smoke run writes its results (set by `parse`); None: bench/results."""


def add_smoke(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)


def add_set(parser: argparse.ArgumentParser, dest: str, help: str) -> None:
    """`--set SECTION.KEY=VALUE`, repeatable: settings for `up`, collected in `dest`."""
    parser.add_argument(
        "--set", dest=dest, action="append", default=[], metavar="SECTION.KEY=VALUE", help=help
    )


def parse(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, smoke: Sequence[str]
) -> argparse.Namespace:
    """The bench's arguments; with --smoke, its `smoke` sizes first, then what was given (so
    an explicit option still wins). "{tmp}" in `smoke` is the smoke run's results directory."""
    global _smoke_dir
    given = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(given)
    if not args.smoke:
        return args
    _smoke_dir = Path(tempfile.mkdtemp(prefix="bench-smoke-"))
    print(f"smoke run: results go to {_smoke_dir}", flush=True)
    return parser.parse_args([*(a.replace("{tmp}", str(_smoke_dir)) for a in smoke), *given])


def ran_with(run_dir: Path, setting: str, expected: Any) -> None:
    """Raise unless the run in `run_dir` resolved `setting` (section.key) to `expected`: each
    side of a comparison checks that it ran the mode it is named for."""
    import tomllib

    node: Any = tomllib.loads((run_dir / "config.toml").read_text())
    for part in setting.split("."):
        node = node[part]
    if node != expected:
        raise RuntimeError(f"{run_dir}: {setting} = {node!r}, expected {expected!r}")


def results_path(name: str) -> Path:
    """bench/results/NAME, or NAME in the smoke run's temporary directory."""
    return (_smoke_dir or RESULTS_DIR) / name


@dataclass
class StepSeries:
    """Per-step numbers of one training run."""

    name: str
    steps: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    """Seconds from the start of training to the end of each step."""
    rewards: list[float] = field(default_factory=list)
    """Mean reward of the completions trained at each step (NaN when unknown)."""
    completion_tokens: list[float] = field(default_factory=list)
    """Completion tokens (end-of-sequence included) trained at each step."""
    total_s: float = math.nan
    """End-to-end wall time of the run: process start to exit, start-up included."""
    extra: dict[str, list[float]] = field(default_factory=dict)
    """Other per-step numbers for diagnosis (ours: step_seconds, trainer_wait_s)."""

    def steady_seconds(self) -> float:
        """Seconds from the end of the first step to the end of the last."""
        return self.wall_s[-1] - self.wall_s[0] if len(self.wall_s) > 1 else math.nan

    def steps_per_s(self) -> float:
        """Steady steps per second (steps 2..N)."""
        seconds = self.steady_seconds()
        return (len(self.steps) - 1) / seconds if seconds > 0 else math.nan

    def tokens_per_s(self) -> float:
        """Steady completion tokens per second (steps 2..N)."""
        seconds = self.steady_seconds()
        return sum(self.completion_tokens[1:]) / seconds if seconds > 0 else math.nan

    def reward_first(self, k: int) -> float:
        return _nanmean(self.rewards[:k])

    def reward_last(self, k: int) -> float:
        return _nanmean(self.rewards[-k:])

    def summary(self, k: int) -> dict[str, float]:
        return {
            "steps": float(len(self.steps)),
            "steps_per_s": self.steps_per_s(),
            "completion_tokens_per_s": self.tokens_per_s(),
            f"reward_first{k}": self.reward_first(k),
            f"reward_last{k}": self.reward_last(k),
            "total_s": self.total_s,
        }

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = _finite(asdict(self))
        return data


def median_run(runs: list[StepSeries]) -> StepSeries:
    """The run with the median steady steps/s (the upper one of an even count)."""
    return sorted(runs, key=lambda s: s.steps_per_s())[len(runs) // 2]


def _nanmean(values: list[float]) -> float:
    good = [v for v in values if not math.isnan(v)]
    return sum(good) / len(good) if good else math.nan


def _finite(value: Any) -> Any:
    """JSON-safe: non-finite floats become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def series_from_metrics(name: str, path: Path, total_s: float = math.nan) -> StepSeries:
    """A StepSeries from a run's metrics.jsonl (one JSON row per trainer step)."""
    series = StepSeries(name=name, total_s=total_s)
    for row in sorted(read_rows(path), key=lambda r: int(r["step"])):
        series.steps.append(int(row["step"]))
        series.wall_s.append(float(row["wall_time"]))
        series.rewards.append(_number(row.get("reward_mean")))
        series.completion_tokens.append(_number(row.get("tokens")))
        for key in EXTRA_METRICS:
            series.extra.setdefault(key, []).append(_number(row.get(key)))
    return series


def pipeline_overrides(
    *,
    model: str,
    group_size: int,
    prompts_per_step: int,
    max_tokens: int,
    lr: float,
    threads: int | str,
    seed: int,
    steps: int,
    temperature: float = 1.0,
) -> list[str]:
    """`--set` overrides that make our pipeline do exactly the benchmark's work.

    Every group is trained (no zero-signal filtering), as TRL trains every group, so a
    step is always `prompts_per_step` prompts generated and trained; a generator asks for
    one step's prompts at a time; no periodic checkpoint falls inside the measured steps.
    """
    return [
        f"model.name_or_path={json.dumps(model)}",
        f"generator.group_size={group_size}",
        f"generator.max_tokens={max_tokens}",
        f"generator.temperature={temperature}",
        f"generator.prompts_per_request={prompts_per_step}",
        f"hub.groups_per_step={prompts_per_step}",
        f"hub.replay.capacity={max(256, 2 * prompts_per_step)}",
        f"trainer.lr={lr}",
        f"trainer.checkpoint_every={steps}",
        f"run.torch_threads={json.dumps(threads)}",
        f"run.seed={seed}",
        "algo.advantage.filter_zero_signal=false",
    ]


def up_command(run_dir: Path, steps: int, overrides: list[str], sync: bool = False) -> list[str]:
    """The `grpo-stream up` command line (run with this interpreter)."""
    argv = [sys.executable, "-m", "grpo_stream.cli.main", "up", "--run-dir", str(run_dir)]
    argv += ["--max-steps", str(steps)]
    for text in overrides:
        argv += ["--set", text]
    return [*argv, "--sync"] if sync else argv


def run_pipeline(
    name: str,
    run_dir: Path,
    steps: int,
    overrides: list[str],
    sync: bool = False,
    timeout_s: float = 3600.0,
) -> StepSeries:
    """Run `grpo-stream up` to completion and return its per-step series.

    Its console output goes to RUN_DIR/up.log; on failure the tail is printed and
    RuntimeError raised.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = up_command(run_dir, steps, overrides, sync)
    print("$ " + " ".join(_quote(a) for a in argv), flush=True)
    log_path = run_dir / "up.log"
    start = time.perf_counter()
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        code = _wait(proc, timeout_s)
    total = time.perf_counter() - start
    metrics = run_dir / "metrics.jsonl"
    series = series_from_metrics(name, metrics, total) if metrics.exists() else None
    if series is None or len(series.steps) < steps:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"grpo-stream up exited with {code} ({log_path}):\n{tail}")
    if code != 0:  # every step is in metrics.jsonl: the run itself completed
        print(f"warning: grpo-stream up exited with {code} after all {steps} steps", flush=True)
    return series


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    """Wait for `proc`; past the timeout SIGTERM it (clean stop), then kill it."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise RuntimeError(f"grpo-stream up ran past {timeout_s:.0f} s and was stopped") from None


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_./=:+," for c in arg) else repr(arg)


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded beside every result."""
    import platform
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for package in ("torch", "transformers", "trl", "accelerate", "pyzmq", "grpo-stream"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),  # other work on the machine skews every rate
        "versions": versions,
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def save_json(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(data), indent=2) + "\n")
    return path


def plot_rewards(path: Path, series: list[StepSeries], title: str, window: int = 5) -> Path:
    """Reward vs seconds of training for each series (raw points and a rolling mean)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for s in series:
        (line,) = ax.plot(s.wall_s, s.rewards, ".", alpha=0.35)
        smooth = rolling_mean(s.rewards, window)
        ax.plot(s.wall_s, smooth, "-", color=line.get_color(), label=s.name)
    ax.set_xlabel("seconds of training (from trainer start)")
    ax.set_ylabel(f"mean reward per step (line: rolling mean of {window})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def rolling_mean(values: list[float], window: int) -> list[float]:
    """Mean of the last `window` values at each position (NaNs skipped)."""
    return [_nanmean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def fmt(value: float, digits: int = 2) -> str:
    return "nan" if math.isnan(value) else f"{value:.{digits}f}"
