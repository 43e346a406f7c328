"""The hf generator's `generate` in process: each prompt prefilled once (its KV cache repeated
G times) against every one of the P*G rows prefilled, on one torch thread, side by side.

Both paths run the same engine and decode loop on the same seeded rows: `generate(prompts, G)`
(one prefill row per prompt) and `sample_rows` on each prompt's row given G times (the path
before one-prefill-per-prompt). The 10x model is bench.vs_trl's architecture with random
weights (no SFT: only speed is measured). Median of --repeats calls each, alternating.

Run: python -m bench.generate [--size tiny|10x|both] [--prompts 16] [--group-size 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import TINY_MODEL, add_smoke, parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="generate: one prefill per prompt vs per row")
    parser.add_argument("--size", choices=["tiny", "10x", "both"], default="both")
    parser.add_argument("--prompts", type=int, default=16, help="P")
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per path")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    add_smoke(parser)
    return parser


SMOKE = ["--size", "tiny", "--prompts", "2", "--group-size", "2", "--max-tokens", "2",
         "--repeats", "1"]  # fmt: skip


def time_paths(model_path: str, args: argparse.Namespace) -> dict[str, float]:
    """Median seconds of `generate` and of the every-row path on `model_path`."""
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.models.loading import load_policy, load_tokenizer
    from grpo_stream.sampling import Sampling

    policy = load_policy(model_path, dtype="float32", device="cpu", trainable=False)
    engine = HFEngine(policy, load_tokenizer(model_path), "cpu")
    prompts = [f"{a}+{b}=" for a, b in zip(range(args.prompts), range(7, 99), strict=False)]
    prompt_ids = engine.tokenizer(prompts)["input_ids"]
    rows = [r for r in prompt_ids for _ in range(args.group_size)]
    g, n = args.group_size, args.max_tokens

    def once() -> Any:
        return engine.generate(prompts, g, Sampling(n, seed=0))

    def every_row() -> Any:
        return engine.sample_rows(rows, Sampling(n, seed=0), inflight=True)

    times: dict[str, list[float]] = {"once": [], "every_row": []}
    for _ in range(3):  # warm-up
        once(), every_row()
    for _ in range(args.repeats):
        for name, call in (("once", once), ("every_row", every_row)):
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    engine.close()
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    import torch

    from bench.vs_trl import build_10x

    args = parse(build_parser(), argv, SMOKE)
    torch.set_num_threads(args.threads)
    sizes = ["tiny", "10x"] if args.size == "both" else [args.size]
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            path = TINY_MODEL
            if size == "10x":
                path = build_10x(TINY_MODEL, Path(tmp) / "m10x", seed=0, sft_steps=0)["path"]
                torch.set_num_threads(args.threads)
            got = time_paths(path, args)
            print(
                f"{size}: P={args.prompts} G={args.group_size} tokens<={args.max_tokens} "
                f"threads={args.threads}: every row prefilled {got['every_row'] * 1e3:.1f} ms, "
                f"one prefill per prompt {got['once'] * 1e3:.1f} ms, "
                f"speedup {got['every_row'] / got['once']:.2f}x"
            )


if __name__ == "__main__":
    main()
