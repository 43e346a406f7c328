"""Soak test: the default pipeline for a while, with a generator SIGKILLed now and then.

`python -m bench.soak --minutes 20 --kill-every 60` starts `grpo-stream up` (restarts on),
kills a generator every `--kill-every` seconds (generator-0, then the next of `--generators`
in turn; the launcher restarts it), samples every
service's RSS (psutil, by the pids `grpo-stream status --json` reports) after warm-up and at
the end, stops the run with SIGTERM, and prints the hub's accounting counters and the weight
events of every service's log (versions applied, fetchers redirected to a relay, relays given
up, versions refused).

The weight features: sparse deltas are on unless `--no-deltas`, with
`weights.delta_max_ratio = 1` so that they are used although the tiny model's fp32 deltas do
not pay (the server would otherwise send it in full); `--relay` turns relays on
with `weights.fanout = 1`, so with `--generators 2` the trainer streams each version to one
generator and redirects the other to it (killing that relay mid-stream is then part of the
soak); `--inflight` turns on `generator.inflight_updates`; `--max-tokens` sets longer
completions, which leave the in-flight swaps room to fall inside a batch.

Exit status 1 (with one line per failure) when a service's RSS grew more than `--rss-growth`
(default 10%), a group reached the trainer twice (batch.sent ids repeated), or the ledger does
not balance: dispatched != trained + filtered + stale + failed + discarded + in_progress, or
relays were on and no fetcher was ever redirected to one (the soak then did not test them).
Nothing runs at import time; processes are tracked by pid.
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
from pathlib import Path
from typing import Any

from bench.common import add_set, add_smoke, parse

TERMINAL = ("trained", "filtered", "stale", "failed", "discarded")
WEIGHT_EVENTS = ("weights.applied", "weights.sent_to_relay", "weights.relay_failed",
                 "weights.refused", "weights.fetch_failed")  # fmt: skip
FAST = ["--set", "transport.heartbeat_interval_s=0.5", "--set", "transport.heartbeat_timeout_s=3.0",
        "--set", "hub.checkpoint_every_s=1.0"]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="grpo-stream soak: kill generators, watch RSS")
    parser.add_argument("--minutes", type=float, default=20.0, help="How long to run.")
    parser.add_argument("--kill-every", type=float, default=60.0,
                        help="Seconds between SIGKILLs of generator-0.")  # fmt: skip
    parser.add_argument("--rss-growth", type=float, default=0.10,
                        help="Largest allowed RSS growth per service (fraction).")  # fmt: skip
    parser.add_argument("--warmup-steps", type=int, default=3,
                        help="Trainer steps before the first RSS sample.")  # fmt: skip
    parser.add_argument("--run-dir", type=Path, default=None, help="Default: a temporary dir.")
    add_set(parser, "overrides", "Extra config override for `up` (repeatable).")
    parser.add_argument("--generators", type=int, default=1,
                        help="generator.count; the kills go round them in turn.")  # fmt: skip
    parser.add_argument("--no-deltas", dest="deltas", action="store_false",
                        help="weights.deltas = false (full sets only).")  # fmt: skip
    parser.add_argument("--relay", action="store_true",
                        help="weights.relay = true with weights.fanout = 1.")  # fmt: skip
    parser.add_argument("--inflight", action="store_true",
                        help="generator.inflight_updates = true.")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=None, help="generator.max_tokens.")
    parser.add_argument("--out", type=Path, default=None, help="Also write the summary here.")
    add_smoke(parser)
    return parser


SMOKE = ["--minutes", "0.4", "--kill-every", "8", "--warmup-steps", "1",
         "--rss-growth", "10"]  # fmt: skip
"""Smoke: one or two kills in ~25 s; RSS is not judged (a run that short is still warming)."""


def feature_overrides(args: argparse.Namespace) -> list[str]:
    """The `--set` overrides the weight-feature flags stand for (before `--set`'s own)."""
    sets = [f"generator.count={args.generators}", f"weights.deltas={str(args.deltas).lower()}"]
    if args.deltas:  # the tiny model's fp32 step deltas (66-75% of the set) would go in full
        sets.append("weights.delta_max_ratio=1.0")
    if args.relay:
        sets += ["weights.relay=true", "weights.fanout=1"]
    if args.inflight:
        sets.append("generator.inflight_updates=true")
    if args.max_tokens is not None:
        sets.append(f"generator.max_tokens={args.max_tokens}")
    return sets


def kill_target(kills: int, generators: int) -> str:
    """The generator the next SIGKILL goes to: round the generators in turn."""
    return f"generator-{kills % max(generators, 1)}"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "grpo_stream.cli.main", *args]


def service_pids(run_dir: Path) -> dict[str, int]:
    """instance -> pid of every registered service, plus the hub's own pid."""
    out = subprocess.run(_cli("status", str(run_dir), "--json"),
                         capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    snap = json.loads(out.stdout)
    pids = {str(s["instance"]): int(s["pid"]) for s in snap["services"]}
    pids["hub"] = int(snap["counters"]["hub_pid"])
    return pids


def sample_rss(run_dir: Path) -> dict[str, int]:
    import psutil

    rss = {}
    for instance, pid in service_pids(run_dir).items():
        try:
            rss[instance] = int(psutil.Process(pid).memory_info().rss)
        except psutil.NoSuchProcess:
            continue  # a generator between its kill and its restart
    return rss


def steps_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def sent_groups(run_dir: Path) -> list[int]:
    groups: list[int] = []
    for path in (run_dir / "logs").glob("grouper-*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("event") == "batch.sent":
                groups.extend(int(g) for g in row["groups"])
    return groups


def weight_events(run_dir: Path) -> dict[str, int]:
    """How often each of WEIGHT_EVENTS was logged, over every service's log, and how many
    fetchers were sent to a relay for a delta (a base >= 0). Rate-limited events log a
    `count` (occurrences since the last line), which is what is summed."""
    tally = dict.fromkeys((*WEIGHT_EVENTS, "weights.sent_to_relay.delta"), 0)
    for path in (run_dir / "logs").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("event") in tally:
                tally[row["event"]] += int(row.get("count", 1))
            if row.get("event") == "weights.sent_to_relay" and int(row["base"]) >= 0:
                tally["weights.sent_to_relay.delta"] += int(row.get("count", 1))
    return tally


def check(
    before: dict[str, int],
    after: dict[str, int],
    counters: dict[str, int],
    groups: list[int],
    growth: float,
    weights: dict[str, int] | None = None,
    relay: bool = False,
) -> list[str]:
    """Failures: RSS growth over `growth`, a group sent twice, an unbalanced ledger, relays on
    but never used."""
    failures = []
    if relay and (weights or {}).get("weights.sent_to_relay", 0) == 0:
        failures.append("relay: no fetcher was redirected to a relay")
    for name in sorted(before.keys() & after.keys()):
        if after[name] > before[name] * (1 + growth):
            failures.append(f"rss: {name} grew {before[name]} -> {after[name]} bytes")
    repeated = sorted({g for g in groups if groups.count(g) > 1})
    if repeated:
        failures.append(f"groups sent twice: {repeated[:20]}")
    done = sum(counters.get(k, 0) for k in TERMINAL) + counters.get("in_progress", 0)
    if counters.get("dispatched", 0) != done:
        failures.append(f"ledger: dispatched={counters.get('dispatched')} != {done} accounted")
    return failures


def _wait_steps(proc: subprocess.Popen[bytes], run_dir: Path, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while steps_done(run_dir) < n:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"soak: the run did not reach {n} steps (up exit {proc.poll()})")
        time.sleep(0.5)


def soak(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """Run, kill, sample; returns the summary (failures under "failures")."""
    seconds = args.minutes * 60
    restarts = int(seconds / max(args.kill_every, 1)) + 5
    sets = [f"run.restarts={restarts}", *feature_overrides(args), *args.overrides]
    cmd = _cli("up", "--run-dir", str(run_dir), "--max-steps", "1000000", *FAST,
               *[x for o in sets for x in ("--set", o)])  # fmt: skip
    log = (run_dir.parent / f"{run_dir.name}.up.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    kills = 0
    try:
        _wait_steps(proc, run_dir, args.warmup_steps, timeout=300)
        before, t0 = sample_rss(run_dir), time.monotonic()
        next_kill = t0 + args.kill_every
        while time.monotonic() - t0 < seconds and proc.poll() is None:
            if time.monotonic() >= next_kill:
                pid = service_pids(run_dir).get(kill_target(kills, args.generators))
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    kills += 1
                next_kill += args.kill_every
            time.sleep(0.5)
        after = sample_rss(run_dir)
        os.kill(proc.pid, signal.SIGTERM)
        exit_code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    counters = json.loads((run_dir / "hub" / "counters.json").read_text())
    groups, weights = sent_groups(run_dir), weight_events(run_dir)
    failures = check(before, after, counters, groups, args.rss_growth, weights, args.relay)
    return {"run_dir": str(run_dir), "seconds": round(time.monotonic() - t0, 1), "kills": kills,
            "steps": steps_done(run_dir), "up_exit": exit_code, "rss_before": before,
            "rss_after": after, "counters": counters, "groups_sent": len(groups),
            "overrides": feature_overrides(args) + args.overrides, "weights": weights,
            "failures": failures}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parse(build_parser(), argv, SMOKE)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        run_dir = args.run_dir or Path(tmp) / "run"
        summary = soak(args, run_dir)
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    for failure in summary["failures"]:
        print(f"soak: FAIL {failure}", file=sys.stderr)
    raise SystemExit(1 if summary["failures"] else 0)


if __name__ == "__main__":
    main()
