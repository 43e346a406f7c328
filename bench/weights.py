"""Weights broadcast benchmark: from the trainer announcing a version to every generator having it.

This process plays the trainer: a real `WeightServer` publishes each version (snapshot, then
announce on PUB). N receiver processes (`bench.weights_receiver`, tracked by pid)
play generators: each follows the announcements with a real `WeightsWatcher`, fetches the
announced version with `fetch_weights` and applies it:

- `--kind tiny`: the shipped tiny model (fp32 on the trainer, as it trains on the CPU),
  applied into a loaded model with `HFEngine.load_weights` (validated, copied in place);
- `--kind synthetic`: a Qwen2-0.5B-shaped set of named tensors (24 layers, hidden 896,
  vocabulary 151936, about 494M parameters, bf16 by default: about 0.92 GiB), applied by
  copying into tensors preallocated in the receiver (not a whole model, to keep memory sane).

Rounds are sequential: version v is published only once every receiver applied v-1. A
warm-up version 0 (re-announced until every receiver has it: PUB/SUB joins late) is not
timed. Every version changes every tensor's values and each receiver reports a probe (sum of
the first element of each applied tensor) that must match the trainer's, so a round cannot
pass without the new weights in place. Times are wall-clock seconds (`time.time()`, one host).

Printed: per receiver and round the fetch, apply and announce->applied seconds and GiB/s;
the last line is `announce->applied: X s, Y GiB/s` (median over rounds of the time until the
last receiver applied; GiB/s counts the bytes delivered to all receivers over that time).

Run: python -m bench.weights [--kind tiny|synthetic] [--receivers 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from bench.common import (
    REPO_ROOT,
    TINY_MODEL,
    add_smoke,
    environment,
    parse,
    results_path,
    save_json,
)
from bench.weights_set import Source, make_source, qwen2_like_shapes, shape_bytes

if TYPE_CHECKING:
    import zmq

GIB = float(1 << 30)
REPORT_TIMEOUT_S = 300.0
"""A round whose receivers have not all reported within this time fails the benchmark (and a
receiver that hears no new version for this long ends)."""


def transport_settings(args: argparse.Namespace) -> Any:
    from grpo_stream.config.transport import TransportSettings

    return TransportSettings(weights_chunk_bytes=args.chunk_mib << 20)


def weights_settings(args: argparse.Namespace) -> Any:
    from grpo_stream.config.transport import WeightsSettings

    # a loaded 2-core machine runs 16 receivers: give a relay's first chunk time to arrive
    return WeightsSettings(deltas=False, relay=args.relay, fanout=args.fanout, relay_stall_s=30)


def check_memory(args: argparse.Namespace, nbytes: int) -> int:
    """Receivers that fit: the trainer holds ~3 copies, each receiver ~3 (target, replica,
    staging) and ~80 MiB of interpreter."""
    import psutil

    available = psutil.virtual_memory().available
    spare = min(available - (1 << 30), args.max_gib * GIB) - 3 * nbytes
    fits = max(0, int(spare // (3 * nbytes + (80 << 20))))
    if fits < args.receivers:
        print(
            f"memory: {available / GIB:.1f} GiB available, --max-gib {args.max_gib}: each "
            f"receiver needs about {3 * nbytes / GIB:.2f} GiB: running {fits} receivers "
            f"instead of {args.receivers}"
        )
    if fits < 1:
        raise SystemExit("not enough memory for one receiver; try --layers or --max-gib")
    return min(fits, int(args.receivers))


def start_receivers(
    args: argparse.Namespace, n: int, addresses: dict[str, str], report: str
) -> list[subprocess.Popen[bytes]]:
    procs = []
    for index in range(n):
        argv = [
            *(sys.executable, "-m", "bench.weights_receiver"),
            *("--kind", args.kind, "--model", args.model, "--dtype", args.dtype),
            *("--layers", str(args.layers), "--rounds", str(args.rounds)),
            *("--hidden", str(args.hidden), "--intermediate", str(args.intermediate)),
            *("--vocab", str(args.vocab), "--fanout", str(args.fanout)),
            *(["--relay"] if args.relay else []),
            "--chunk-mib",
            str(args.chunk_mib),
            *("--index", str(index), "--report", report),
            *("--announce", addresses["announce"], "--weights", addresses["weights"]),
        ]
        procs.append(subprocess.Popen(argv, cwd=REPO_ROOT))
    return procs


def collect(pull: zmq.Socket[Any], want: int, key: str, version: int | None = None) -> list[Any]:
    """Wait for `want` reports holding `key` (for `version` when given)."""
    got: list[Any] = []
    deadline = time.monotonic() + REPORT_TIMEOUT_S
    while len(got) < want:
        if not pull.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            raise RuntimeError(f"{len(got)}/{want} receivers reported {key} in time")
        msg = json.loads(pull.recv())
        if key in msg and (version is None or msg.get("version") == version):
            got.append(msg)
    return got


def warm_up(server: Any, source: Source, pull: zmq.Socket[Any], n: int) -> None:
    """Publish version 0 until every receiver applied it (late PUB/SUB joins miss it)."""
    source.bump(0)
    have: set[int] = set()
    for _ in range(60):
        server.publish(0, source.named)
        deadline = time.monotonic() + 5.0
        while len(have) < n and pull.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            msg = json.loads(pull.recv())
            if msg.get("version") == 0:
                have.add(int(msg["index"]))
        if len(have) == n:
            return
    raise RuntimeError(f"only {len(have)}/{n} receivers applied the warm-up version")


def timed_round(
    server: Any, source: Source, pull: zmq.Socket[Any], n: int, version: int
) -> dict[str, Any]:
    expected = source.bump(version)
    t0, cpu0 = time.time(), time.process_time()
    server.publish(version, source.named)
    t_announced, cpu_announced = time.time(), time.process_time()  # after the snapshot
    reports = sorted(collect(pull, n, "t_applied", version), key=lambda r: int(r["index"]))
    cpu_end = time.process_time()  # the server's thread sent everything before the last apply
    for r in reports:
        if abs(float(r["probe"]) - expected) > 1e-3 * max(1.0, abs(expected)):
            raise RuntimeError(f"receiver {r['index']} applied wrong values at version {version}")
    return {
        "version": version,
        "snapshot_s": t_announced - t0,
        "publish_to_all_applied_s": max(r["t_applied"] for r in reports) - t0,
        "announce_to_all_applied_s": max(r["t_applied"] for r in reports) - t_announced,
        "trainer_snapshot_cpu_s": cpu_announced - cpu0,
        "trainer_send_cpu_s": cpu_end - cpu_announced,
        "receivers": [
            {
                "index": r["index"],
                "fetch_s": r["t_fetched"] - r["t_seen"],
                "apply_s": r["t_applied"] - r["t_fetched"],
                "cpu_fetch_s": r["cpu_fetch_s"],
                "cpu_apply_s": r["cpu_apply_s"],
                "announce_to_applied_s": r["t_applied"] - t_announced,
            }
            for r in reports
        ],
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import zmq

    from grpo_stream.config.transport import SecuritySettings
    from grpo_stream.transport.weights import WeightServer

    torch.set_num_threads(1)
    source = make_source(args)
    nbytes = source.nbytes()
    n = check_memory(args, nbytes)
    ctx: zmq.Context[Any] = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)  # reports left unread at the end are of no use
    report = f"tcp://127.0.0.1:{pull.bind_to_random_port('tcp://127.0.0.1')}"
    server = WeightServer(
        ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", transport_settings(args), SecuritySettings(),
        weights_settings(args),
    )  # fmt: skip
    procs = start_receivers(args, n, server.addresses, report)
    try:
        collect(pull, n, "ready")
        warm_up(server, source, pull, n)
        rounds = []
        for version in range(1, args.rounds + 1):
            sent = server.sent_bytes
            rounds.append(timed_round(server, source, pull, n, version))
            rounds[-1]["trainer_sent_bytes"] = server.sent_bytes - sent
        for proc in procs:
            if args.relay:
                proc.terminate()  # relays serve until the last child has its version
            proc.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server.close()
        pull.close()
        ctx.term()
    return {"kind": args.kind, "dtype": args.dtype, "receivers": n, "bytes": nbytes,
            "tensors": len(source.named), "rounds": rounds}  # fmt: skip


def report_rounds(result: dict[str, Any], verbose: bool) -> tuple[float, float]:
    """Print the rounds; returns (median publish->all applied seconds, GiB/s per receiver)."""
    gib = result["bytes"] / GIB
    n = result["receivers"]
    print(f"  {result['tensors']} tensors, {gib:.3f} GiB per version, {n} receivers")
    for rnd in result["rounds"]:
        sent = rnd["trainer_sent_bytes"] / result["bytes"]
        cpu = statistics.fmean(r["cpu_fetch_s"] + r["cpu_apply_s"] for r in rnd["receivers"])
        print(
            f"  version {rnd['version']}: snapshot {rnd['snapshot_s']:.3f} s, publish->all "
            f"applied {rnd['publish_to_all_applied_s']:.3f} s, trainer sent {sent:.1f} sets; "
            f"CPU s: trainer snapshot {rnd['trainer_snapshot_cpu_s']:.3f} + send "
            f"{rnd['trainer_send_cpu_s']:.3f}, per receiver {cpu:.3f}"
        )
        for r in rnd["receivers"] if verbose else []:
            print(
                f"    receiver {r['index']}: fetch {r['fetch_s']:.3f} s, apply "
                f"{r['apply_s']:.3f} s, announce->applied {r['announce_to_applied_s']:.3f} s, "
                f"CPU fetch {r['cpu_fetch_s']:.3f} s, apply {r['cpu_apply_s']:.3f} s"
            )
    seconds = statistics.median(r["publish_to_all_applied_s"] for r in result["rounds"])
    # a receiver's first two versions fault in its two staging buffers; later ones reuse them
    steady = [r["publish_to_all_applied_s"] for r in result["rounds"] if r["version"] > 2]
    if steady:
        result["steady_s"] = statistics.median(steady)
        print(f"  steady (version 3 on): {result['steady_s']:.3f} s, "
              f"{gib / result['steady_s']:.2f} GiB/s")  # fmt: skip
    result["cpu_gib_s"] = cpu_rates(result)
    print("  GiB per CPU second (median over rounds): " +
          ", ".join(f"{k} {v:.2f}" for k, v in result["cpu_gib_s"].items()))  # fmt: skip
    return seconds, gib / seconds


def cpu_rates(result: dict[str, Any]) -> dict[str, float]:
    """GiB of the set per CPU second of each side, median over rounds: what scales across
    hosts, where wall time on a few shared cores does not (a receiver's fetch and apply; the
    trainer's snapshot; the trainer's serving, per GiB it sent)."""
    gib, rounds = result["bytes"] / GIB, result["rounds"]

    def rate(seconds: list[float]) -> float:
        return gib / max(statistics.median(seconds), 1e-9)

    per_receiver = [r["cpu_fetch_s"] + r["cpu_apply_s"] for rnd in rounds for r in rnd["receivers"]]
    return {
        "receiver": rate(per_receiver),
        "receiver_fetch": rate([r["cpu_fetch_s"] for rnd in rounds for r in rnd["receivers"]]),
        "trainer_snapshot": rate([rnd["trainer_snapshot_cpu_s"] for rnd in rounds]),
        # bytes the trainer sent (several sets with several receivers) per send CPU second
        "trainer_send": statistics.median(
            rnd["trainer_sent_bytes"] / GIB / max(rnd["trainer_send_cpu_s"], 1e-9) for rnd in rounds
        ),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="weights: full throughput, fan-out, deltas")
    add = parser.add_argument
    add("--kind", choices=["tiny", "synthetic"], default="synthetic")
    add("--receivers", type=int, default=1, help="internal: generator processes of a phase")
    add("--rounds", type=int, default=3, help="timed versions per phase")
    add("--model", default=TINY_MODEL, help="tiny: model name or path")
    add("--dtype", choices=["bf16", "fp32"], default="bf16", help="synthetic")
    add("--layers", type=int, default=24, help="synthetic full set: decoder layers")
    add("--hidden", type=int, default=896, help="synthetic full set: hidden size")
    add("--intermediate", type=int, default=4864, help="synthetic full set: MLP size")
    add("--vocab", type=int, default=151_936, help="synthetic full set: vocabulary")
    add("--fanout", type=int, default=4, help="weights.fanout of the fan-out phase")
    add("--fanout-receivers", default="1,4,16", help="receiver counts of the fan-out phase")
    add("--fanout-layers", type=int, default=2, help="fan-out set: decoder layers")
    add("--fanout-vocab", type=int, default=8192, help="fan-out set: vocabulary")
    add("--delta-layers", type=int, default=24, help="delta set: decoder layers")
    add("--delta-vocab", type=int, default=151_936, help="delta set: vocabulary")
    add("--delta-steps", type=int, default=1, help="AdamW steps per learning rate")
    add("--delta-lrs", default="1e-6,1e-5", help="learning rates of the delta phase")
    add("--compare-runs", action="store_true", help="delta: also size index+value runs")
    add("--chunk-mib", type=int, default=8, help="transport.weights_chunk_bytes in MiB")
    add("--max-gib", type=float, default=6.0, help="memory budget of the whole benchmark")
    add("--relay", action="store_true", help="internal: receivers relay (weights.relay)")
    add("--phases", default="full,fanout,delta", help="which of profile,full,fanout,delta to run")
    add("--verbose", action="store_true", help="print every receiver of every round")
    add("--no-save", action="store_true", help="do not write bench/results")
    add("--index", type=int, default=0, help="internal: receiver index")
    add("--announce", help="internal: the PUB address")
    add("--weights", help="internal: the ROUTER address")
    add("--report", help="internal: the benchmark's PULL address")
    add_smoke(parser)
    return parser


SMOKE = ["--rounds", "1", "--layers", "1", "--hidden", "128", "--intermediate", "256",
         "--vocab", "1024", "--fanout-receivers", "1,2", "--fanout-layers", "1",
         "--fanout-vocab", "512", "--delta-layers", "1", "--delta-vocab", "1024",
         "--delta-lrs", "1e-5",
         "--max-gib", "1"]  # fmt: skip


def run_phases(args: argparse.Namespace) -> dict[str, Any]:
    """Full set to one receiver; fan-out 1/4/16 with relays; delta sizes after AdamW."""
    out: dict[str, Any] = {}
    phases = set(args.phases.split(","))
    if "profile" in phases:
        from bench.weights_profile import profile, report

        out["profile"] = profile(args)
        report(out["profile"])
    if "full" in phases:
        print(f"full set, 1 receiver, no deltas, no relays ({args.kind}):")
        full = measure(argparse.Namespace(**{**vars(args), "receivers": 1, "relay": False}))
        _, out["full_gib_s"] = report_rounds(full, args.verbose)
        if "steady_s" in full:
            out["full_steady_gib_s"] = full["bytes"] / GIB / full["steady_s"]
        out["full"] = full
    if "fanout" in phases:
        run_fanout(args, out)
    if "delta" in phases:
        run_delta(args, out)
    return out


def run_fanout(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Fan-out 1/4/16 with relays on a small set (time until the last receiver applied)."""
    fan = {**vars(args), "layers": args.fanout_layers, "vocab": args.fanout_vocab,
           "hidden": 512, "intermediate": 2048, "kind": "synthetic", "relay": True}  # fmt: skip
    out["fanout"] = {}
    for n in [int(x) for x in args.fanout_receivers.split(",")]:
        print(f"fan-out: {n} receivers, relays on, weights.fanout {args.fanout}:")
        result = measure(argparse.Namespace(**{**fan, "receivers": n}))
        out["fanout"][n] = {"seconds": report_rounds(result, args.verbose)[0], **result}
    counts = sorted(out["fanout"])
    out["fanout_ratio"] = out["fanout"][counts[-1]]["seconds"] / out["fanout"][counts[0]]["seconds"]


def run_delta(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Delta bytes per version after real AdamW steps at each learning rate."""
    import torch

    from bench.weights_delta import measure_deltas, report

    torch.set_num_threads(1)
    shapes = qwen2_like_shapes(layers=args.delta_layers, vocab=args.delta_vocab)
    print(f"deltas: {shape_bytes(shapes, 2) / GIB:.3f} GiB bf16 set, real AdamW steps:")
    out["delta"] = {}
    for lr in [float(x) for x in args.delta_lrs.split(",")]:
        totals = measure_deltas(shapes, lr, args.delta_steps, 3, args.compare_runs)
        out["delta"][lr] = {"ratio": report(lr, totals, args.compare_runs), **vars(totals)}


def main(argv: list[str] | None = None) -> None:
    args = parse(build_parser(), argv, SMOKE)
    if args.receivers < 1 or args.rounds < 1:
        raise SystemExit("--receivers and --rounds must be at least 1")
    out = run_phases(args)
    if not args.no_save:
        path = save_json(results_path("weights.json"), {**out, "env": environment()})
        print(f"saved {path}")
    parts = []
    if "delta" in out:
        parts.append(f"delta bytes ratio {out['delta'][min(out['delta'])]['ratio']:.4f}")
    if "fanout" in out:
        top, low = max(out["fanout"]), min(out["fanout"])
        parts.append(f"fanout{top}/fanout{low} {out['fanout_ratio']:.2f}")
    if "full_gib_s" in out:
        steady = out.get("full_steady_gib_s")
        parts.append(f"full GiB/s {out['full_gib_s']:.2f}" + ("" if steady is None else
                     f" (steady {steady:.2f})"))  # fmt: skip
    print(", ".join(parts))


if __name__ == "__main__":
    main()
