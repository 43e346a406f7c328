"""Generation, publishing and whole runs at real shapes for bench/gpu_scale.py (loaded from
beside it, run with -P).

- generate: the hf engine in bf16 at each shape and batch (prompts x 8 completions): tokens/s
  against the bandwidth bound of bench/gpu_shapes.decode_bound.
- publish: `grpo-stream up` at a shape for a few steps, every service on this machine: from
  the run's own logs, the trainer's `weights.published` (bytes, device -> host snapshot
  time) and the generator's `weights.applied` of the same version, so the time from
  publish to the generator serving that version, and the bytes per second over it.
- up: `grpo-stream up` at a shape for `up_steps` steps: steps/s, the device's (CPU: the
  process tree's) peak memory, the hub's accounting (every dispatched group trained,
  filtered or still in flight: nothing lost, nothing failed).
Random-init models earn no reward: these runs train every group (no zero-signal filtering).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import gpu_scale_train  # type: ignore[import-not-found]  # loaded beside this file
import gpu_shapes  # type: ignore[import-not-found]

TERMINAL = ("trained", "filtered", "stale", "failed", "discarded")
"""The hub's counters of groups that ended (grpo_stream.hub.ledger's invariant: dispatched =
these + in progress)."""


def generate(ns: argparse.Namespace) -> dict[str, Any]:
    """Tokens/s of the hf engine at each batch of ns.gen_prompts prompts x 8, and the fraction
    of the bandwidth bound it reaches."""
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.models.loading import load_policy, load_tokenizer
    from grpo_stream.sampling import Sampling

    shape = gpu_shapes.SHAPES[ns.shape]
    path = gpu_scale_train.model_dir(shape, Path(ns.work), ns.device)
    tokenizer = load_tokenizer(str(path))
    model = load_policy(str(path), device=ns.device, trainable=False)
    engine = HFEngine(model, tokenizer, device=ns.device)
    engine.generate(["1+2="], group_size=8, sampling=Sampling(max_tokens=4, seed=0))  # warm-up
    prompt = len(tokenizer("12+34=")["input_ids"])
    runs = []
    for prompts in ns.gen_prompts:
        t0 = time.perf_counter()
        sampling = Sampling(max_tokens=ns.new_tokens, seed=1)
        groups = engine.generate(["12+34="] * prompts, group_size=8, sampling=sampling)
        seconds = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for g in groups for c in g.completions)
        batch = prompts * 8
        bound = (
            gpu_shapes.decode_bound(shape, batch, ns.new_tokens, prompt, ns.hbm_gbps)
            if ns.hbm_gbps
            else None
        )
        rate = tokens / seconds
        runs.append(
            {
                "batch": batch,
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_s": rate,
                "bound_tokens_per_s": bound,
                "of_bound": rate / bound if bound else None,
            }
        )
        print(json.dumps(runs[-1]), flush=True)
    engine.close()
    ok = all(r["tokens"] > 0 for r in runs)
    return {"ok": ok, "shape": shape.name, "hbm_gbps": ns.hbm_gbps, "runs": runs}


class PeakMemory:
    """The highest memory in use while it runs, sampled every 0.2 s: the GPU's (NVML, all
    processes) on a GPU, else the resident memory of `pid` and its children."""

    def __init__(self, pid: int, cuda: bool) -> None:
        self.pid, self.cuda, self.peak = pid, cuda, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _read(self) -> int:
        if self.cuda:
            import pynvml

            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
        import psutil

        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def _run(self) -> None:
        if self.cuda:
            import pynvml

            pynvml.nvmlInit()
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self._read())


def run_up(ns: argparse.Namespace, name: str, steps: int, sets: list[str]) -> dict[str, Any]:
    """`grpo-stream up` of the installed package on ns.shape's model: its exit status, wall
    time, steps, the hub's counters, peak memory and the run directory."""
    shape = gpu_shapes.SHAPES[ns.shape]
    path = gpu_scale_train.model_dir(shape, Path(ns.work), ns.device)
    run_dir = Path(ns.work) / name
    base = [
        f'trainer.device="{ns.device}"',
        f"model.name_or_path={json.dumps(str(path))}",
        "algo.advantage.filter_zero_signal=false",
        "generator.max_tokens=16",
    ]
    cmd = [sys.executable, "-m", "grpo_stream.cli.main", "up", "--run-dir", str(run_dir)]
    cmd += ["--max-steps", str(steps)] + [a for s in base + sets for a in ("--set", s)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakMemory(proc.pid, ns.device.startswith("cuda")) as memory:
        try:
            stdout, stderr = proc.communicate(timeout=ns.timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            stdout, stderr = proc.communicate(timeout=30)
    seconds = time.perf_counter() - t0
    lines = (run_dir / "metrics.jsonl").read_text().splitlines() if run_dir.exists() else []
    rows = [json.loads(line) for line in lines if line.strip()]
    counters = _counters(run_dir)
    terminal = sum(counters.get(k, 0) for k in TERMINAL)
    return {
        "rc": proc.returncode,
        "seconds": seconds,
        "steps": len(rows),
        "rows": rows,
        "counters": counters,
        "nothing_lost": bool(counters)
        and counters.get("dispatched") == terminal + counters.get("in_progress", 0)
        and counters.get("failed", 0) == 0,
        "peak_memory_gib": memory.peak / 2**30,
        "run_dir": str(run_dir),
        "stderr_tail": stderr[-1500:] if proc.returncode else "",
        "stdout_tail": stdout[-500:] if proc.returncode else "",
    }


def _counters(run_dir: Path) -> dict[str, int]:
    path = run_dir / "hub" / "counters.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {str(k): int(v) for k, v in data.items()}


def up(ns: argparse.Namespace) -> dict[str, Any]:
    """A whole run at ns.shape: steps/s from the trainer's first to its last step."""
    run = run_up(ns, "up-run", ns.up_steps, [])
    rows = run.pop("rows")
    walls = [float(r["wall_time"]) for r in rows if "wall_time" in r]
    span = walls[-1] - walls[0] if len(walls) > 1 else 0.0
    found = versions(Path(run["run_dir"]))
    return {
        "ok": run["rc"] == 0 and run["steps"] == ns.up_steps and run["nothing_lost"],
        "shape": gpu_shapes.SHAPES[ns.shape].name,
        "steps_per_s": (len(walls) - 1) / span if span > 0 else None,
        "versions": found,
        "median_publish_to_applied_s": _median_lag(found),
        **run,
    }


def _events(run_dir: Path, name: str) -> list[dict[str, Any]]:
    """Every log event called `name` in the run's logs (RUN_DIR/logs/*.jsonl)."""
    out = []
    for path in sorted((run_dir / "logs").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and event.get("event") == name:
                out.append(event)
    return out


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()


def versions(run_dir: Path) -> list[dict[str, Any]]:
    """Each version both published (the weight server's event) and applied by the generator:
    its size, the trainer's device -> host snapshot GiB/s, and the time from its publish to
    the generator applying it (the generator then serves it)."""
    published = {int(e["version"]): e for e in _events(run_dir, "weights.published") if "mb" in e}
    applied = {int(e["version"]): e for e in _events(run_dir, "weights.applied")}
    out = []
    for version in sorted(set(published) & set(applied)):
        pub, got = published[version], applied[version]
        gib, snap_s = float(pub["mb"]) / 1024, float(pub["snapshot_ms"]) / 1e3
        lag = _ts(got) - _ts(pub)
        out.append(
            {
                "version": version,
                "gib": gib,
                "snapshot_gib_per_s": gib / snap_s if snap_s > 0 else None,
                "publish_to_applied_s": lag,
                "gib_per_s_publish_to_applied": gib / lag if lag > 0 else None,
                "generator_apply_s": float(got["seconds"]),
            }
        )
    return out


def _median_lag(found: list[dict[str, Any]]) -> float | None:
    later = found[1:] or found  # the first fetch also opens the connection
    lags = sorted(v["publish_to_applied_s"] for v in later)
    return lags[len(lags) // 2] if lags else None


def publish(ns: argparse.Namespace) -> dict[str, Any]:
    """Publishing at ns.shape in a short run (`versions`)."""
    run = run_up(ns, "publish-run", ns.publish_steps, [])
    run.pop("rows")
    found = versions(Path(run["run_dir"]))
    return {
        "ok": run["rc"] == 0 and bool(found),
        "shape": gpu_shapes.SHAPES[ns.shape].name,
        "versions": found,
        "median_publish_to_applied_s": _median_lag(found),
        **run,
    }
