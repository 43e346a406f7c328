"""What the single hub process carries under simulated fleets.

`python -m bench.hub_load` starts the REAL hub (`grpo-stream run grouper`, as `up` starts it,
with the run's secret) once per fleet size, and beside it simulated peers over real ZeroMQ
sockets (`bench.hub_sim`: signed Hello, Welcome, credits, heartbeats; our codec for every
message; no model): N generators spread over a few processes, each answering its PromptBatch
with synthetic Rollouts (G completions of `--tokens` tokens) after a delay; a few scorers
that answer at once; one trainer that asks for the next step as soon as a TrainBatch came.

The offered load is the same at every fleet size (`--offered` groups/s: each generator's delay
is N * prompts_per_request / offered), so what changes with N is what the hub pays per
connected peer. The staleness gate is opened wide enough for every generator to hold its
prompts twice over (in-flight groups = throughput x generation time, Little's law).

Measured over the last `--seconds` of each run: groups/s and completion tokens/s the trainer
received; dispatch latency (a generator's WorkRequest sent -> its PromptBatch received;
likewise for scorers; BatchRequest -> TrainBatch for the trainer) p50/p99; the hub's CPU
(cores, from /proc), its CPU per group delivered (what bounds it once it has a whole core:
on a shared machine the hub gets what the others leave) and RSS; the load average.
`--profile DIR` runs the hub under cProfile (one .prof per N). Results:
bench/results/hub_load.json and hub_load.png. Nothing runs at import time.

`--auth on off` (the default) runs each fleet twice, back to back: with the run's secret
(signed Hellos, every message after them sealed: `grpo_stream.transport.seal`) and without
one; the table prints what authentication costs side by side: messages/s the fleet sent the
hub and the hub's CPU per group, each as on/off. `--smoke` is a seconds-long run of one small
fleet, both ways (the default test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS_DIR
from grpo_stream.hub.auth import write_secret

CLK_TCK = 100  # os.sysconf("SC_CLK_TCK") on Linux
JOIN_S = 120.0  # longest wait for every simulated peer's Welcome


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="the hub under simulated fleets (real ZeroMQ)")
    p.add_argument("--generators", type=int, nargs="+", default=[8, 64, 256, 1024])
    p.add_argument("--payloads", nargs="+", choices=["hub", "direct"], default=["hub", "direct"],
                   help="hub.payloads modes to run, each at every fleet size")  # fmt: skip
    p.add_argument("--offered", type=float, default=1500.0,
                   help="groups/s the fleet offers (sets each generator's delay)")  # fmt: skip
    p.add_argument("--tokens", type=int, default=1024, help="tokens per completion")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompts-per-request", type=int, default=1)
    p.add_argument("--groups-per-step", type=int, default=64)
    p.add_argument("--scorers", type=int, default=16)
    p.add_argument("--peers-per-process", type=int, default=256,
                   help="simulated generators per process")  # fmt: skip
    p.add_argument("--seconds", type=float, default=20.0, help="measured window per fleet")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds after joining, unmeasured")
    p.add_argument("--profile", type=Path, default=None, help="cProfile the hub into DIR")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "hub_load.json")
    p.add_argument("--label", default="", help="a note stored with the results")
    p.add_argument("--auth", nargs="+", choices=["on", "off"], default=["on", "off"],
                   help="with the run's secret (sealed sessions) and/or without")  # fmt: skip
    p.add_argument("--smoke", action="store_true", help="one small fleet, seconds long")
    return p


SMOKE = ["--generators", "8", "--payloads", "hub", "--seconds", "2", "--warmup", "1",
         "--offered", "100", "--tokens", "64", "--groups-per-step", "8",
         "--scorers", "2"]  # fmt: skip
"""What `--smoke` runs (any option given after it still wins)."""


def sim_model(run_dir: Path, tokens: int) -> Path:
    """A model directory that is only a config (no weights: nothing generates): the hub's
    pre-flight reads its context length and skips the token fit (no tokenizer)."""
    path = run_dir / "sim-model"
    path.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "simulated", "max_position_embeddings": 4 * tokens}
    (path / "config.json").write_text(json.dumps(config))
    return path


def hub_settings(
    args: argparse.Namespace, n: int, run_dir: Path, payloads: str = "hub"
) -> list[str]:
    per_step = args.groups_per_step
    held = 2 * n * args.prompts_per_request + 2 * per_step  # every generator busy, twice over
    staleness = max(1, math.ceil(held / per_step) - 1)
    sets = [
        f'run.run_dir="{run_dir}"',
        f'model.name_or_path="{sim_model(run_dir, args.tokens)}"',
        f"generator.group_size={args.group_size}",
        f"generator.max_tokens={args.tokens}",
        f"generator.prompts_per_request={args.prompts_per_request}",
        f"trainer.micro_batch_tokens={4 * args.tokens}",
        f"hub.groups_per_step={per_step}",
        f"hub.max_staleness={staleness}",
        f"hub.replay.capacity={4 * per_step}",
        f"hub.payloads={payloads}",
        "security.check_content=false",  # a simulated model has no tokenizer: ids are random
    ]
    return [a for s in sets for a in ("--set", s)]


def proc_stats(pid: int) -> tuple[float, float]:
    """(CPU seconds used, RSS MiB) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime
    rss_kib = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return cpu, rss_kib / 1024


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def _sim(role: str, hub: str, secret: Path | None, first: int, count: int, out: Path,
         stop_at: float, extra: list[str]) -> subprocess.Popen[bytes]:  # fmt: skip
    extra = [*extra, "--stop-file", str(out.parent / "stop")]
    argv = [sys.executable, "-m", "bench.hub_sim", role, hub, str(secret or "-"), str(first),
            str(count), str(out), "--stop-at", str(stop_at), *extra]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL)


def run_fleet(
    args: argparse.Namespace, n: int, tmp: Path, payloads: str, auth: str = "on"
) -> dict[str, Any]:
    """One hub (hub.payloads = `payloads`, with the run's secret when `auth` is "on") and its
    simulated fleet of `n` generators; the window's numbers."""
    run_dir = tmp / f"run-{payloads}-{n}-{auth}"
    secret = write_secret(run_dir / "secret") if auth == "on" else None
    secret_args = [] if secret is None else ["--secret-file", str(secret)]
    prof = []
    if args.profile is not None:
        prof = ["-m", "cProfile", "-o", str(args.profile / f"hub-{payloads}-{n}.prof")]
    hub_argv = [sys.executable, *prof, "-m", "grpo_stream.cli.main", "run", "grouper",
                "--instance", "grouper-0", "--log-json", *secret_args,
                *hub_settings(args, n, run_dir, payloads)]  # fmt: skip
    hub_log = (run_dir / "hub.out").open("wb")
    hub = subprocess.Popen(hub_argv, stdout=hub_log, stderr=subprocess.STDOUT)
    sims: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
    try:
        addr = run_dir / "hub.addr"
        deadline = time.monotonic() + 120
        while not (addr.exists() and addr.read_text().strip()):
            if time.monotonic() > deadline or hub.poll() is not None:
                tail = (run_dir / "hub.out").read_text()[-2000:]
                raise RuntimeError(f"the hub did not start:\n{tail}")
            time.sleep(0.1)
        address = addr.read_text().strip()
        stop_at = time.time() + JOIN_S + args.warmup + args.seconds  # the latest end
        delay = n * args.prompts_per_request / args.offered
        common = ["--tokens", str(args.tokens), "--group-size", str(args.group_size),
                  "--payloads", payloads]  # fmt: skip
        gen = [*common, "--delay-s", f"{delay:.6f}", "--credits", str(args.prompts_per_request)]
        procs = math.ceil(n / args.peers_per_process)
        for k in range(procs):
            first, count = k * n // procs, (k + 1) * n // procs - k * n // procs
            out = run_dir / f"gen-{k}.json"
            sims.append(("generator", out, _sim("generator", address, secret, first, count, out,
                                                stop_at, gen)))  # fmt: skip
        for role, count, extra in [("scorer", args.scorers, [*common, "--credits", "8"]),
                                   ("trainer", 1, common)]:  # fmt: skip
            out = run_dir / f"{role}.json"
            sims.append((role, out, _sim(role, address, secret, 0, count, out, stop_at, extra)))
        joined = [out.with_suffix(".joined") for _, out, _ in sims]
        while not all(j.exists() for j in joined) and time.time() < stop_at - args.seconds:
            time.sleep(0.2)  # every peer welcomed (or out of time: measured as it is)
        time.sleep(args.warmup)
        window_start = time.time()
        cpu0, _ = proc_stats(hub.pid)
        t0 = time.monotonic()
        time.sleep(args.seconds)
        cpu1, rss = proc_stats(hub.pid)
        hub_cpu = (cpu1 - cpu0) / (time.monotonic() - t0)
        stop_at = time.time()
        (run_dir / "stop").touch()
        for _, _, proc in sims:
            proc.wait(timeout=60)
    finally:
        for _, _, proc in sims:
            if proc.poll() is None:
                proc.kill()
        hub.terminate()
        hub.wait(timeout=60)
        hub_log.close()
    records = {role: [] for role in ("generator", "scorer", "trainer")}  # type: dict[str, list[dict[str, Any]]]
    for role, out, _ in sims:
        records[role].append(json.loads(out.read_text()))
    row = summarize(records, window_start, stop_at)
    row.update(auth=auth, payloads=payloads, generators=n, generator_processes=procs,
               scorers=args.scorers, offered_groups_per_s=args.offered, generator_delay_s=delay,
               hub_cpu_cores=round(hub_cpu, 3), hub_rss_mib=round(rss, 1),
               hub_cpu_ms_per_group=round(1000 * hub_cpu / max(row["groups_per_s"], 1e-9), 3),
               load_average=round(os.getloadavg()[0], 1),
               hub=hub_stopped(run_dir))  # fmt: skip
    return row


def summarize(records: dict[str, list[dict[str, Any]]], start: float, end: float) -> dict[str, Any]:
    """Rates and latency percentiles over [start, end] (wall clock)."""

    def window_latencies(role: str) -> list[float]:
        pairs = (zip(r["latencies_s"], r["stamps"], strict=True) for r in records[role])
        return [lat for pair in pairs for lat, t in pair if start <= t <= end]

    got = [(t, g, k) for r in records["trainer"] for t, g, k in r["groups"] if start <= t <= end]
    seconds = end - start
    out: dict[str, Any] = {
        "groups_per_s": round(sum(g for _, g, _ in got) / seconds, 1),
        "completion_tokens_per_s": round(sum(k for _, _, k in got) / seconds),
        "steps": len(got),
    }
    for role, name in [("generator", "dispatch"), ("scorer", "score_dispatch"),
                       ("trainer", "batch")]:  # fmt: skip
        lats = window_latencies(role)
        out[f"{name}_p50_ms"] = round(1000 * percentile(lats, 50), 2)
        out[f"{name}_p99_ms"] = round(1000 * percentile(lats, 99), 2)
        out[f"{name}_samples"] = len(lats)
    errors: dict[str, int] = {}
    for r in (r for rs in records.values() for r in rs):
        for code, count in r["errors"].items():
            errors[code] = errors.get(code, 0) + count
    out["errors_seen_by_peers"] = errors
    sent = sum(
        _sent_in(r.get("sent_series", []), start, end) for rs in records.values() for r in rs
    )
    out["messages_per_s"] = round(sent / seconds, 1)
    return out


def _sent_in(series: list[list[float]], start: float, end: float) -> float:
    """Messages a peer process sent within [start, end], from its (time, total sent) samples
    (once a second: linear between two)."""
    if not series:
        return 0.0
    times = [t for t, _ in series]
    totals = [float(c) for _, c in series]
    return float(np.interp(end, times, totals) - np.interp(start, times, totals))


def hub_stopped(run_dir: Path) -> dict[str, Any]:
    """The hub's own accounting at its stop (ledger counters, rejections)."""
    for line in reversed((run_dir / "hub.out").read_text().splitlines()):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "hub.stopped":
            keep = ("dispatched", "trained", "filtered", "stale", "failed", "in_progress",
                    "duplicates_dropped", "requeued_payload", "rejected")  # fmt: skip
            return {k: event[k] for k in keep if k in event}
    return {}


def auth_cost(rows: list[dict[str, Any]]) -> list[str]:
    """One line per fleet run both ways: messages/s and hub CPU per group, on vs off."""
    out = []
    for on in (r for r in rows if r["auth"] == "on"):
        off = next((r for r in rows if r["auth"] == "off" and r["payloads"] == on["payloads"]
                    and r["generators"] == on["generators"]), None)  # fmt: skip
        if off is None:
            continue
        msgs = on["messages_per_s"] / max(off["messages_per_s"], 1e-9)
        cpu = on["hub_cpu_ms_per_group"] / max(off["hub_cpu_ms_per_group"], 1e-9)
        out.append(
            f"auth on/off  payloads={on['payloads']} generators={on['generators']}: "
            f"messages/s {on['messages_per_s']} / {off['messages_per_s']} = {msgs:.3f}, "
            f"hub CPU ms/group {on['hub_cpu_ms_per_group']} / {off['hub_cpu_ms_per_group']} "
            f"= {cpu:.3f}"
        )
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in sorted({r.get("payloads", "hub") for r in rows}):
        mine = [r for r in rows if r.get("payloads", "hub") == mode and r.get("auth") != "off"]
        ns = [r["generators"] for r in mine]
        a.plot(ns, [r["groups_per_s"] for r in mine], "o-", label=f"groups/s, payloads={mode}")
        b.plot(ns, [r["dispatch_p50_ms"] for r in mine], "o-", label=f"p50, payloads={mode}")
        b.plot(ns, [r["dispatch_p99_ms"] for r in mine], "o--", label=f"p99, payloads={mode}")
    a.axhline(1000, ls="--", c="grey", label="goal 1,000 groups/s")
    a.set(xscale="log", xlabel="simulated generators", ylabel="groups/s (G=8 x 1k tokens)")
    a.legend()
    b.axhline(50, ls="--", c="grey", label="goal p99 50 ms")
    b.set(xscale="log", yscale="log", xlabel="simulated generators", ylabel="ms")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args([*SMOKE, *argv] if "--smoke" in argv else argv)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hub-load-") as tmp:
        for payloads in args.payloads:
            for n in args.generators:
                for auth in args.auth:  # back to back: the same load on the machine
                    row = run_fleet(args, n, Path(tmp), payloads, auth)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    header = ("auth", "payloads", "generators", "groups_per_s", "messages_per_s",
              "completion_tokens_per_s", "dispatch_p50_ms", "dispatch_p99_ms", "batch_p99_ms",
              "hub_cpu_cores", "hub_cpu_ms_per_group", "hub_rss_mib", "load_average")  # fmt: skip
    print("  ".join(header))
    for r in rows:
        print("  ".join(str(r[h]) for h in header))
    for line in auth_cost(rows):
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    args.out.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1) + "\n")
    plot(rows, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
