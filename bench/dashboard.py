"""What the dashboard costs a run: steps/s of the same `grpo-stream up` with the dashboard
off, on with no page open, and on with a page open (a client reading its event stream for
the whole run, as a browser tab does), alternated `--repeats` times; and the CPU seconds the
dashboard process itself used in each run.

The claim under test: with no page open the dashboard costs the run nothing (it polls
nothing: grpo_stream.dashboard.feed); a page open costs what one status request and a few
file reads per `dashboard.poll_s` cost.

Run: python -m bench.dashboard [--steps 60] [--repeats 3]
`--smoke` (seconds): the dashboard process alone on a made-up finished run, its CPU per
second with no page open and then with one open, side by side.
Last line: `ratio on/off steps/s: R (page open/off: P)`, or in smoke mode
`dashboard CPU s/s: idle I, page open P`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.common import (
    REPO_ROOT,
    RESULTS_DIR,
    StepSeries,
    environment,
    fmt,
    run_pipeline,
    save_json,
)

MODES = {
    "off": ["dashboard.enabled=false"],
    "on": ["dashboard.enabled=true", "dashboard.port=0"],
    "page": ["dashboard.enabled=true", "dashboard.port=0"],
}
"""The settings of each mode (page: on, with a page open)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="the dashboard's cost to a run")
    parser.add_argument("--steps", type=int, default=60, help="trainer steps of each run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode (rotated order)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--smoke", action="store_true", help="seconds: the process alone")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    return parser


class Watch:
    """Follows one run's dashboard process: its CPU seconds; with `page`, reads its events."""

    def __init__(self, run_dir: Path, page: bool) -> None:
        self.run_dir = run_dir
        self.page = page
        self.cpu_s = 0.0
        self.events = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._cpu, daemon=True)]
        if page:
            self._threads.append(threading.Thread(target=self._read, daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _cpu(self) -> None:
        proc = None
        while not self._stop.is_set():
            proc = proc or dashboard_process(self.run_dir)
            if proc is not None:
                try:
                    times = proc.cpu_times()
                    self.cpu_s = times.user + times.system
                except psutil.NoSuchProcess:
                    return
            time.sleep(0.25)

    def _read(self) -> None:
        url_file = self.run_dir / "dashboard.url"
        while not self._stop.is_set() and not url_file.exists():
            time.sleep(0.1)
        if self._stop.is_set():
            return
        url = url_file.read_text().strip()
        try:
            with httpx.stream("GET", _events_url(url), timeout=None) as response:
                for line in response.iter_lines():
                    self.events += line.startswith("event: ")
                    if self._stop.is_set():
                        return
        except httpx.HTTPError:
            return  # the run ended and its dashboard with it


def dashboard_process(run_dir: Path) -> psutil.Process | None:
    """The `grpo-stream dashboard RUN_DIR` process that `up` started."""
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "dashboard" in cmdline and str(run_dir) in cmdline:
            return proc
    return None


def run_modes(args: argparse.Namespace, tmp: Path) -> dict[str, list[dict[str, Any]]]:
    """Every mode `--repeats` times, the order rotated each repeat (off on page, on page off,
    page off on, ...) so that a machine's drift does not always favour the same mode."""
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    names = list(MODES)
    for repeat in range(args.repeats):
        shift = repeat % len(names)
        for mode in names[shift:] + names[:shift]:
            sets = MODES[mode]
            run_dir = tmp / f"{mode}-{repeat}"
            load_before = os.getloadavg()[0]
            watch = Watch(run_dir, page=mode == "page")
            try:
                series: StepSeries = run_pipeline(
                    mode, run_dir, args.steps, sets, False, args.timeout
                )
            finally:
                watch.stop()
            row = {
                "steps_per_s": series.steps_per_s(),
                "total_s": series.total_s,
                "dashboard_cpu_s": watch.cpu_s,
                "events_read": watch.events,
                "load_before": load_before,
                "load_after": os.getloadavg()[0],
            }
            print(f"{mode:5s} repeat {repeat}: {json.dumps(row)}", flush=True)
            results[mode].append(row)
    return results


def _events_url(page: str) -> str:
    """The event stream's address beside `page`, the address the dashboard wrote (which
    carries its token as `?token=...`: every request needs it, on loopback too)."""
    return str(httpx.URL(page).join("api/events").copy_merge_params(httpx.URL(page).params))


def smoke(seconds: float = 2.0) -> dict[str, float]:
    """The dashboard process on a made-up finished run: CPU s/s idle, then with a page."""
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        run_dir = Path(tmp)
        rows = (json.dumps({"step": s, "wall_time": float(s), "kl": 0.0}) for s in range(1, 201))
        (run_dir / "metrics.jsonl").write_text("\n".join(rows) + "\n")
        (run_dir / "outcome.json").write_text(
            json.dumps({"ended": "completed", "steps": 200, "reason": "", "wall_time": 0.0})
        )
        argv = [sys.executable, "-m", "grpo_stream.cli.main", "dashboard", str(run_dir),
                "--port", "0", "--poll", "0.2"]  # fmt: skip
        server = subprocess.Popen(argv, stderr=subprocess.DEVNULL, cwd=REPO_ROOT)
        try:
            url = _wait_url(run_dir / "dashboard.url", server)
            proc = psutil.Process(server.pid)
            time.sleep(0.5)  # its start-up done
            startup = _cpu(proc)
            idle = _cpu_per_s(proc, seconds)
            events = 0
            with httpx.stream("GET", _events_url(url), timeout=10) as response:
                start = _cpu(proc)
                t0 = time.monotonic()
                for line in response.iter_lines():
                    events += line.startswith("event: ")
                    if time.monotonic() - t0 >= seconds:
                        break
                page = (_cpu(proc) - start) / (time.monotonic() - t0)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return {
        "startup_cpu_s": startup,
        "idle_cpu_s_per_s": idle,
        "page_cpu_s_per_s": page,
        "events": events,
    }


def _wait_url(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            raise RuntimeError(f"the dashboard exited with code {proc.returncode}")
        time.sleep(0.1)
    raise RuntimeError("the dashboard did not start")


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _cpu_per_s(proc: psutil.Process, seconds: float) -> float:
    start, t0 = _cpu(proc), time.monotonic()
    time.sleep(seconds)
    return (_cpu(proc) - start) / (time.monotonic() - t0)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.smoke:
        got = smoke()
        print(f"load {os.getloadavg()[0]:.2f}; {json.dumps(got)}")
        print(
            f"dashboard CPU s/s: idle {fmt(got['idle_cpu_s_per_s'], 4)}, "
            f"page open {fmt(got['page_cpu_s_per_s'], 4)} ({got['events']:.0f} events)"
        )
        return
    if args.steps < 3 or args.repeats < 1:
        raise SystemExit("--steps must be >= 3 and --repeats >= 1")
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        results = run_modes(args, Path(tmp))
    median = {m: statistics.median(r["steps_per_s"] for r in rows) for m, rows in results.items()}
    cpu = {m: statistics.median(r["dashboard_cpu_s"] for r in rows) for m, rows in results.items()}
    for mode in MODES:
        print(f"{mode:5s} steps/s {fmt(median[mode], 3)}  dashboard CPU {fmt(cpu[mode], 2)} s")
    if not args.no_save:
        result = {"args": vars(args), "env": environment(), "runs": results, "median": median}
        path = save_json(RESULTS_DIR / "dashboard.json", result)
        print(f"saved {path.relative_to(REPO_ROOT)}")
    print(
        f"ratio on/off steps/s: {fmt(median['on'] / median['off'], 3)} "
        f"(page open/off: {fmt(median['page'] / median['off'], 3)})"
    )


if __name__ == "__main__":
    main()
