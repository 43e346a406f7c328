"""In-flight weight updates vs updates between batches: generator idle time per update,
trainer wait per step, steps/s (generator.inflight_updates; one process, loopback).

The generator is a real `HFEngine` (the tiny model, or bench.vs_trl's 10x model, fp32 on the
CPU) following a real `WeightServer`'s announcements with a real `WeightsWatcher`, as the
generator service does: `between` fetches and applies the newest version before each batch
(`update_from_server`, the generator waits), `inflight` fetches it on a thread
(`fetch_in_background`) and swaps it in between two decoding steps (`take_fetched`), KV
recomputed (`inflight`) or kept (`inflight-keep`). The trainer is a thread that is NOT a real
optimiser (that would take the generator's cores): per step it waits until `--groups` groups
whose oldest token is at most `--max-staleness` versions behind have arrived (older ones are
dropped, counted), sleeps `--train-s`, then publishes a new version (the initial weights plus
small noise: real bytes through the real server, deltas on).

Printed per mode: steps/s, trainer wait per step, generator idle per applied update (main-
thread seconds in fetch+apply; in flight the KV recompute after a swap is generation time,
not idle), generation tokens/s, mean staleness of trained groups by their oldest token (what
the staleness gate counts) and by token (how many versions behind the average trained token
was), the share of trained groups whose tokens span several versions, groups dropped stale;
the last line is the steps/s ratio inflight/between (pooled over `--repeats` rounds, the
modes alternating within each round).

Run: python -m bench.inflight [--model tiny|10x] [--max-tokens 256] [--steps 6] [--repeats 1]
"""

from __future__ import annotations

import argparse
import queue
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import TINY_MODEL, add_smoke, environment, parse, results_path, save_json
from grpo_stream.sampling import Sampling

MODES = ("between", "inflight", "inflight-keep")
PROMPTS = ["12+34=", "7+8=", "100-1=", "9+9="]


@dataclass
class Tally:
    """What one mode measured."""

    steps: int = 0
    seconds: float = 0.0
    trainer_wait_s: list[float] = field(default_factory=list)
    idle_s: list[float] = field(default_factory=list)  # per applied update
    tokens: int = 0
    gen_s: float = 0.0
    staleness: list[int] = field(default_factory=list)
    token_age: int = 0  # sum over trained tokens of (step - version that sampled it)
    token_count: int = 0
    mixed: int = 0  # trained groups whose tokens span several versions
    dropped: int = 0

    def add(self, other: Tally) -> None:
        """Pool `other` (another round of the same mode) into this one."""
        for name in ("steps", "seconds", "tokens", "gen_s", "token_age", "token_count",
                     "mixed", "dropped"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.trainer_wait_s += other.trainer_wait_s
        self.idle_s += other.idle_s
        self.staleness += other.staleness

    def row(self) -> dict[str, float]:
        return {
            "steps_per_s": self.steps / max(self.seconds, 1e-9),
            "trainer_wait_per_step_s": statistics.fmean(self.trainer_wait_s or [0.0]),
            "idle_per_update_s": statistics.fmean(self.idle_s or [0.0]),
            "updates": len(self.idle_s),
            "gen_tokens_per_s": self.tokens / max(self.gen_s, 1e-9),
            "staleness_mean": statistics.fmean(self.staleness or [0.0]),
            "token_staleness_mean": self.token_age / max(self.token_count, 1),
            "mixed_version_groups": self.mixed / max(len(self.staleness), 1),
            "dropped_stale": self.dropped,
        }


def versions(engine: Any, count: int) -> list[list[tuple[str, Any]]]:
    """`count` weight sets near the engine's: what a trainer at a small lr would publish."""
    import torch

    gen = torch.Generator().manual_seed(0)
    base = [(n, p.detach().clone()) for n, p in engine.model.named_parameters()]
    return [
        [(n, p + 1e-3 * torch.randn(p.shape, generator=gen)) for n, p in base] for _ in range(count)
    ]


Arrived = dict[int, int]
"""One group as the trainer sees it: version -> how many of its tokens that version sampled."""


def token_versions(runs: list[tuple[int, int]], length: int, version: int) -> Arrived:
    """version -> token count of one completion from its (first index, version) runs; a
    completion without runs (no tokens) counts as `version`, the engine's when it started."""
    if not runs:
        return {version: 0}
    counts: Arrived = {}
    for (start, v), (end, _) in zip(runs, [*runs[1:], (length, 0)], strict=True):
        counts[v] = counts.get(v, 0) + end - start
    return counts


def trainer(server: Any, sets: list[Any], arrived: queue.Queue[Arrived], args: Any,
            tally: Tally, done: threading.Event) -> None:  # fmt: skip
    """Wait for fresh groups, 'train' (sleep), publish; `tally` gets the waits and ages."""
    start = time.perf_counter()
    for step in range(args.steps):
        t0, got = time.perf_counter(), 0
        while got < args.groups:
            group = arrived.get()
            if step - min(group) > args.max_staleness:
                tally.dropped += 1
                continue
            tally.staleness.append(step - min(group))
            tally.token_age += sum((step - v) * n for v, n in group.items())
            tally.token_count += sum(group.values())
            tally.mixed += len(group) > 1
            got += 1
        tally.trainer_wait_s.append(time.perf_counter() - t0)
        time.sleep(args.train_s)
        server.publish(step + 1, sets[(step + 1) % len(sets)])
        tally.steps += 1
    tally.seconds = time.perf_counter() - start
    done.set()


def run_mode(mode: str, engine: Any, sets: list[Any], args: Any) -> Tally:
    import zmq

    from grpo_stream.config.transport import SecuritySettings, TransportSettings
    from grpo_stream.transport.fetch import WeightsWatcher
    from grpo_stream.transport.weights import WeightServer

    ctx: zmq.Context[Any] = zmq.Context()
    transport, security = TransportSettings(), SecuritySettings()
    server = WeightServer(ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", transport, security)
    address = server.addresses["weights"]
    engine.load_weights(sets[0], 0)
    server.publish(0, sets[0])
    engine.update_from_server(address, 0)
    watcher = WeightsWatcher(ctx, server.addresses["announce"], transport, security)
    tally, arrived, done = Tally(), queue.Queue[Arrived](), threading.Event()

    def take() -> None:
        t0 = time.perf_counter()
        if engine.take_fetched() is not None:
            tally.idle_s.append(time.perf_counter() - t0)
        announced = watcher.poll(0)
        if announced is not None and announced > engine.version:
            engine.fetch_in_background(address)

    if mode != "between":
        engine.enable_inflight(take, keep_kv=mode == "inflight-keep")
    thread = threading.Thread(target=trainer, args=(server, sets, arrived, args, tally, done))
    thread.start()
    batch = 0
    while not done.is_set():
        announced = watcher.poll(0)
        if mode == "between" and announced is not None and announced > engine.version:
            t0 = time.perf_counter()
            engine.update_from_server(address, -1)
            tally.idle_s.append(time.perf_counter() - t0)
        elif mode != "between":
            take()
        t0, version = time.perf_counter(), engine.version
        groups = engine.generate(PROMPTS, args.group_size, Sampling(args.max_tokens, seed=batch))
        tally.gen_s += time.perf_counter() - t0
        batch += 1
        for g in groups:
            group: Arrived = {}
            for c in g.completions:
                tally.tokens += len(c.token_ids)
                for v, n in token_versions(c.version_runs, len(c.token_ids), version).items():
                    group[v] = group.get(v, 0) + n
            arrived.put(group)
    thread.join()
    if engine.wait_fetched(60.0):  # a version still on its way belongs to this mode
        engine.take_fetched()
    engine.enable_inflight(None)
    watcher.close()
    server.close()
    ctx.destroy(linger=0)
    return tally


def load_engine(model: str, work: Path) -> Any:
    from grpo_stream.config import ModelSettings
    from grpo_stream.config.transport import SecuritySettings, TransportSettings
    from grpo_stream.engines.hf import HFEngine

    name = TINY_MODEL
    if model == "10x":
        from bench.vs_trl import build_10x

        name = build_10x(TINY_MODEL, work / "model-10x", seed=0, sft_steps=0)["path"]
    settings = ModelSettings(name_or_path=name, dtype="float32")
    return HFEngine.from_settings(settings, TransportSettings(), SecuritySettings(), "cpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "10x"], default="tiny")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups", type=int, default=4, help="groups per trainer step")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--train-s", type=float, default=0.5, help="simulated step compute")
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--repeats", type=int, default=1, help="rounds of all modes, pooled")
    add_smoke(parser)
    smoke = ["--max-tokens", "8", "--group-size", "2", "--groups", "2", "--steps", "2",
             "--train-s", "0.05"]  # fmt: skip
    args = parse(parser, argv, smoke)
    import torch

    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {"args": vars(args), "environment": environment(), "modes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        engine = load_engine(args.model, Path(tmp))
        sets = versions(engine, 2)
        params = sum(p.numel() for p in engine.model.parameters())
        print(f"model {args.model}: {params} parameters, max_tokens {args.max_tokens}", flush=True)
        pooled = {mode: Tally() for mode in args.modes.split(",")}
        for round_ in range(args.repeats):
            for mode, tally in pooled.items():
                once = run_mode(mode, engine, sets, args)
                tally.add(once)
                row = once.row()
                results.setdefault("rounds", []).append({"round": round_, "mode": mode, **row})
                print(f"{round_} {mode:14} " + "  ".join(f"{k} {v:.4g}" for k, v in row.items()),
                      flush=True)  # fmt: skip
        engine.close()
        for mode, tally in pooled.items():
            row = results["modes"][mode] = tally.row()
            print(f"all {mode:12} " + "  ".join(f"{k} {v:.4g}" for k, v in row.items()))
    modes = results["modes"]
    if "between" in modes and "inflight" in modes:
        ratio = modes["inflight"]["steps_per_s"] / modes["between"]["steps_per_s"]
        results["steps_per_s_ratio"] = ratio
        print(f"steps/s inflight/between {ratio:.3f}")
    save_json(results_path(f"inflight_{args.model}.json"), results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
