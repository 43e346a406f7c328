"""Weights broadcast benchmark: from the trainer announcing a version to every generator having it.

This process plays the trainer: a real `WeightServer` publishes each version (snapshot, then
announce on PUB). N receiver processes (this module with `--role receiver`, tracked by pid)
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.common import REPO_ROOT, RESULTS_DIR, TINY_MODEL, environment, save_json

if TYPE_CHECKING:
    import torch
    import zmq

GIB = float(1 << 30)
REPORT_TIMEOUT_S = 300.0
"""A round whose receivers have not all reported within this time fails the benchmark."""


def qwen2_like_shapes(
    layers: int = 24,
    hidden: int = 896,
    intermediate: int = 4864,
    vocab: int = 151_936,
    heads: int = 14,
    kv_heads: int = 2,
) -> list[tuple[str, tuple[int, ...]]]:
    """Parameter names and shapes of a Qwen2 model (defaults: Qwen2-0.5B, tied embeddings)."""
    head_dim = hidden // heads
    kv = kv_heads * head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "self_attn.q_proj.weight", (hidden, hidden)),
            (p + "self_attn.q_proj.bias", (hidden,)),
            (p + "self_attn.k_proj.weight", (kv, hidden)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, hidden)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (hidden, hidden)),
            (p + "mlp.gate_proj.weight", (intermediate, hidden)),
            (p + "mlp.up_proj.weight", (intermediate, hidden)),
            (p + "mlp.down_proj.weight", (hidden, intermediate)),
            (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
        ]
    shapes.append(("model.norm.weight", (hidden,)))
    return shapes


def shape_bytes(shapes: list[tuple[str, tuple[int, ...]]], itemsize: int) -> int:
    total = 0
    for _, shape in shapes:
        n = 1
        for d in shape:
            n *= d
        total += n * itemsize
    return total


def fill_value(version: int, index: int) -> float:
    """The value every element of tensor `index` holds at `version` (exact in bf16)."""
    return ((version * 7 + index) % 64) / 4.0


def probe(tensors: list[torch.Tensor]) -> float:
    """Sum of the first element of each tensor: differs between versions."""
    return float(sum(float(t.reshape(-1)[0]) for t in tensors if t.numel()))


# ---- receiver side (one generator) ---------------------------------------------------------


class SyntheticTarget:
    """Preallocated tensors that a received version is copied into."""

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype) -> None:
        import torch

        self.tensors = {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes}

    def apply(self, named: list[tuple[str, Any]], version: int) -> float:
        """Check names and shapes of the whole version, then copy; returns the probe."""
        import torch

        from grpo_stream.engines.base import to_torch

        items = [(name, to_torch(arr)) for name, arr in named]
        if {n for n, _ in items} != set(self.tensors):
            raise ValueError(f"version {version}: names differ from the preallocated set")
        for name, src in items:
            if tuple(src.shape) != tuple(self.tensors[name].shape):
                raise ValueError(f"version {version}: {name} has shape {tuple(src.shape)}")
        with torch.no_grad():
            for name, src in items:
                self.tensors[name].copy_(src)
        return probe(list(self.tensors.values()))


class ModelTarget:
    """A tiny-model HFEngine; a version is applied with `load_weights`."""

    def __init__(self, model_path: str) -> None:
        from grpo_stream.engines.hf import HFEngine
        from grpo_stream.models.loading import load_policy, load_tokenizer

        policy = load_policy(model_path, dtype="float32", trainable=False)
        self.engine = HFEngine(policy, load_tokenizer(model_path))

    def apply(self, named: list[tuple[str, Any]], version: int) -> float:
        self.engine.load_weights(named, version)
        return probe(list(self.engine.model.parameters()))


def run_receiver(args: argparse.Namespace) -> None:
    """Follow announcements; fetch, apply and report each new version until the last."""
    import torch
    import zmq

    from grpo_stream.transport.fetch import WeightsWatcher, fetch_weights
    from grpo_stream.transport.settings import SecuritySettings, TransportSettings

    torch.set_num_threads(1)
    transport, security = TransportSettings(), SecuritySettings()
    target: SyntheticTarget | ModelTarget
    if args.kind == "synthetic":
        target = SyntheticTarget(qwen2_like_shapes(layers=args.layers), _dtype(args.dtype))
    else:
        target = ModelTarget(args.model)
    ctx: zmq.Context[Any] = zmq.Context()
    watcher = WeightsWatcher(ctx, args.announce, transport, security)
    report = ctx.socket(zmq.PUSH)
    report.setsockopt(zmq.LINGER, 5000)  # the last report must reach the benchmark before exit
    report.connect(args.report)
    try:
        report.send_json({"ready": args.index})
        applied, idle_since = -1, time.monotonic()
        while applied < args.rounds and time.monotonic() - idle_since < REPORT_TIMEOUT_S:
            version = watcher.poll(200)
            if version is None or version == applied:
                continue
            t_seen = time.time()
            got, named = fetch_weights(ctx, args.weights, transport, security, version=version)
            t_fetched = time.time()
            value = target.apply(named, got)
            t_applied = time.time()
            applied, idle_since = got, time.monotonic()
            report.send_json(
                {"index": args.index, "version": got, "probe": value, "t_seen": t_seen,
                 "t_fetched": t_fetched, "t_applied": t_applied}
            )  # fmt: skip
    finally:
        watcher.close()
        report.close()
        ctx.term()


# ---- trainer side ---------------------------------------------------------------------------


@dataclass
class Source:
    """What the trainer publishes: named tensors and a way to make the next version."""

    named: list[tuple[str, torch.Tensor]]
    unique: list[torch.Tensor]  # each storage once (tied weights counted once)

    def bump(self, version: int) -> float:
        """Change every tensor for `version`; returns the probe receivers must report."""
        import torch

        with torch.no_grad():
            for i, tensor in enumerate(self.unique):
                tensor.fill_(fill_value(version, i))
        return probe(self.unique)

    def nbytes(self) -> int:
        return int(sum(t.numel() * t.element_size() for t in self.unique))


def _dtype(name: str) -> torch.dtype:
    import torch

    return torch.bfloat16 if name == "bf16" else torch.float32


def make_source(args: argparse.Namespace) -> Source:
    import torch

    if args.kind == "synthetic":
        tensors = [
            (name, torch.empty(shape, dtype=_dtype(args.dtype)))
            for name, shape in qwen2_like_shapes(layers=args.layers)
        ]
        return Source(tensors, [t for _, t in tensors])
    from grpo_stream.models.loading import load_policy

    model = load_policy(args.model, dtype="float32", trainable=False)
    # The trainer publishes its state_dict: tied lm_head is in it and sent once (aliased).
    return Source(list(model.state_dict().items()), [p.data for p in model.parameters()])


def check_memory(args: argparse.Namespace, nbytes: int) -> int:
    """Receivers that fit: the trainer holds ~3 copies, each receiver ~2 (target + received)."""
    import psutil

    available = psutil.virtual_memory().available
    spare = available - 3 * nbytes - (1 << 30)  # keep 1 GiB for everyone else
    fits = max(0, int(spare // (2 * nbytes + (300 << 20))))
    if fits < args.receivers:
        print(
            f"memory: {available / GIB:.1f} GiB available, each receiver needs about "
            f"{2 * nbytes / GIB:.2f} GiB: running {fits} receivers instead of {args.receivers}"
        )
    if fits < 1:
        raise SystemExit("not enough free memory for one receiver; try --layers or --dtype bf16")
    return min(fits, int(args.receivers))


def start_receivers(
    args: argparse.Namespace, n: int, addresses: dict[str, str], report: str
) -> list[subprocess.Popen[bytes]]:
    procs = []
    for index in range(n):
        argv = [
            *(sys.executable, "-m", "bench.weights", "--role", "receiver"),
            *("--kind", args.kind, "--model", args.model, "--dtype", args.dtype),
            *("--layers", str(args.layers), "--rounds", str(args.rounds)),
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
    t0 = time.time()
    server.publish(version, source.named)
    t_announced = time.time()  # publish announces after the snapshot is complete
    reports = sorted(collect(pull, n, "t_applied", version), key=lambda r: int(r["index"]))
    for r in reports:
        if abs(float(r["probe"]) - expected) > 1e-3 * max(1.0, abs(expected)):
            raise RuntimeError(f"receiver {r['index']} applied wrong values at version {version}")
    return {
        "version": version,
        "snapshot_s": t_announced - t0,
        "announce_to_all_applied_s": max(r["t_applied"] for r in reports) - t_announced,
        "receivers": [
            {
                "index": r["index"],
                "fetch_s": r["t_fetched"] - r["t_seen"],
                "apply_s": r["t_applied"] - r["t_fetched"],
                "announce_to_applied_s": r["t_applied"] - t_announced,
            }
            for r in reports
        ],
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import zmq

    from grpo_stream.transport.settings import SecuritySettings, TransportSettings
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
        ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", TransportSettings(), SecuritySettings()
    )
    procs = start_receivers(args, n, server.addresses, report)
    try:
        collect(pull, n, "ready")
        warm_up(server, source, pull, n)
        rounds = [timed_round(server, source, pull, n, v) for v in range(1, args.rounds + 1)]
        for proc in procs:
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


def report_rounds(result: dict[str, Any]) -> tuple[float, float]:
    """Print every round; returns (median seconds to all applied, overall GiB/s)."""
    gib = result["bytes"] / GIB
    n = result["receivers"]
    what = f"{result['tensors']} tensors, {gib:.3f} GiB per version"
    print(f"{result['kind']}: {what}, {n} receivers")
    for rnd in result["rounds"]:
        print(f"version {rnd['version']}: snapshot {rnd['snapshot_s']:.3f} s")
        for r in rnd["receivers"]:
            secs = r["announce_to_applied_s"]
            print(
                f"  receiver {r['index']}: fetch {r['fetch_s']:.3f} s, apply {r['apply_s']:.3f} s,"
                f" announce->applied {secs:.3f} s, {gib / secs:.2f} GiB/s"
            )
        print(f"  all applied: {rnd['announce_to_all_applied_s']:.3f} s")
    seconds = statistics.median(r["announce_to_all_applied_s"] for r in result["rounds"])
    return seconds, n * gib / seconds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="announce->applied time of a weights version")
    parser.add_argument("--kind", choices=["tiny", "synthetic"], default="synthetic")
    parser.add_argument("--receivers", type=int, default=2, help="generator processes")
    parser.add_argument("--rounds", type=int, default=3, help="timed versions")
    parser.add_argument("--model", default=TINY_MODEL, help="tiny: model name or path")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="synthetic")
    parser.add_argument("--layers", type=int, default=24, help="synthetic: decoder layers")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    parser.add_argument("--role", choices=["main", "receiver"], default="main", help="internal")
    parser.add_argument("--index", type=int, default=0, help="internal: receiver index")
    parser.add_argument("--announce", help="internal: the PUB address")
    parser.add_argument("--weights", help="internal: the ROUTER address")
    parser.add_argument("--report", help="internal: the benchmark's PULL address")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.receivers < 1 or args.rounds < 1:
        raise SystemExit("--receivers and --rounds must be at least 1")
    if args.role == "receiver":
        run_receiver(args)
        return
    result = measure(args)
    seconds, gib_s = report_rounds(result)
    if not args.no_save:
        name = args.kind if args.kind == "tiny" else f"synthetic_{args.dtype}"
        name += f"_r{result['receivers']}"
        path = save_json(RESULTS_DIR / f"weights_{name}.json", {**result, "env": environment()})
        print(f"saved {path.relative_to(REPO_ROOT)}")
    print(f"announce->applied: {seconds:.3f} s, {gib_s:.2f} GiB/s")


if __name__ == "__main__":
    main()
