"""LoRA vs full fine-tuning: what a version weighs, how fast it is applied, what a trainer
step costs, and the reward reached at equal steps.

Part 1 (in this process, on the 10x model of bench.vs_trl, built in a temporary directory):
- bytes per published version (the snapshot the weight server serves), LoRA vs full;
- publish -> applied seconds: WeightServer.publish, then an hf engine's update_from_server
  over loopback ZeroMQ (median of --repeats), LoRA (merge and unmerged modes) vs full;
- hf engine generation with the adapter merged vs unmerged (tokens/s);
- trainer step time (median of --repeats steps on one synthetic batch) and optimizer state
  bytes (AdamW moments), LoRA vs full.
Part 2 (`grpo-stream up` on the shipped tiny model, same threads and seed for both): mean
reward of the first and last --window steps after --steps steps, LoRA (--lora-lr) vs full
(--full-lr); the LoRA run's gain as a fraction of the full run's gain.

Run: flock /tmp/grpo-bench.lock python -m bench.lora [--steps 60] [--skip-reward]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, TINY_MODEL, environment, pipeline_overrides, run_pipeline
from bench.common import save_json as write_json

PROMPTS = ["12+34=", "7+8=", "50+25=", "3+4="]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="up steps per reward run")
    parser.add_argument("--window", type=int, default=10, help="steps averaged for rewards")
    parser.add_argument("--full-lr", type=float, default=1e-4)
    parser.add_argument("--lora-lr", type=float, default=2e-3)
    parser.add_argument("--r", type=int, default=16, help="LoRA rank")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sft-steps", type=int, default=0, help="10x model warm start")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-reward", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "lora.json")
    return parser.parse_args(argv)


def _config(model: str, run_dir: Path, lora: bool, r: int) -> Any:
    from grpo_stream.config import load_config

    sets = [f"model.name_or_path={json.dumps(model)}", f"run.run_dir={json.dumps(str(run_dir))}"]
    if lora:
        sets += ["trainer.lora.enabled=true", f"trainer.lora.r={r}", f"trainer.lora.alpha={2 * r}"]
    return load_config(None, sets)


def _batch(seed: int) -> Any:
    """One synthetic step: 8 groups of 8 completions of 8-16 tokens."""
    import numpy as np

    from grpo_stream.hub.batches import build_batch
    from grpo_stream.hub.replay import Group
    from grpo_stream.protocols.messages import SamplingParams

    rng = np.random.default_rng(seed)
    groups = []
    for gid in range(8):
        lengths = rng.integers(8, 17, size=8)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        rewards = rng.random(8).astype(np.float32)
        groups.append(Group(
            group_id=gid, policy_version=0,
            prompt_ids=rng.integers(3, 200, size=8).astype(np.int32),
            completion_ids=rng.integers(3, 200, size=int(offsets[-1])).astype(np.int32),
            completion_offsets=offsets,
            logprobs=(-rng.random(int(offsets[-1])) - 0.5).astype(np.float32),
            rewards=rewards,
            advantages=((rewards - rewards.mean()) / (rewards.std() + 1e-4)).astype(np.float32),
            valid=np.ones(8, dtype=bool),
            sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8),
        ))  # fmt: skip
    return build_batch(0, groups)


def _optimizer_bytes(optimizer: Any) -> int:
    import torch

    return sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )


def measure_trainer(model: str, work: Path, lora: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Step time, optimizer bytes, version bytes and publish->applied for one trainer kind."""
    import torch

    from grpo_stream.training.state import TrainState

    state = TrainState.create(_config(model, work / ("lora" if lora else "full"), lora, args.r))
    batch = _batch(args.seed)
    times = []
    for _ in range(args.repeats + 1):  # the first step warms up
        t0 = time.perf_counter()
        assert state.train_step(batch).applied
        times.append(time.perf_counter() - t0)
    out = {
        "step_s": statistics.median(times[1:]),
        "optimizer_bytes": _optimizer_bytes(state.optimizer),
        "trainable_params": sum(p.numel() for p in state.model.parameters() if p.requires_grad),
    }
    modes = [True, False] if lora else [None]
    for merge in modes:
        key = "" if merge is None else ("merge_" if merge else "unmerged_")
        out.update({key + k: v for k, v in _publish_apply(state, model, merge, args).items()})
    torch.set_num_threads(args.threads)
    return out


def _publish_apply(
    state: Any, model: str, merge: bool | None, args: argparse.Namespace
) -> dict[str, Any]:
    import zmq

    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.engines.lora import HFAdapter
    from grpo_stream.models.loading import load_policy, load_tokenizer
    from grpo_stream.transport.settings import SecuritySettings, TransportSettings
    from grpo_stream.transport.weights import WeightServer

    engine = HFEngine(load_policy(model, dtype="float32", trainable=False), load_tokenizer(model))
    if merge is not None:
        engine._lora = HFAdapter(engine.model, merge=merge)
    ctx: zmq.Context[Any] = zmq.Context()
    server = WeightServer(
        ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", TransportSettings(), SecuritySettings()
    )
    seconds, size = [], 0
    try:
        for i in range(args.repeats + 1):
            t0 = time.perf_counter()
            snapshot = server.publish(i + 1, state.named_weights())
            engine.update_from_server(server.addresses["weights"], -1)
            seconds.append(time.perf_counter() - t0)
            size = snapshot.total_bytes
        t0 = time.perf_counter()
        groups = engine.generate(PROMPTS, group_size=8, max_tokens=16, temperature=1.0, seed=0)
        gen_s = time.perf_counter() - t0
    finally:
        server.close()
        engine.close()
        ctx.destroy(linger=0)
    tokens = sum(len(c.token_ids) for g in groups for c in g.completions)
    return {
        "version_bytes": size,
        "publish_to_applied_s": statistics.median(seconds[1:]),
        "generate_tokens_per_s": tokens / gen_s,
    }


def reward_runs(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    common = dict(model=TINY_MODEL, group_size=8, prompts_per_step=16, max_tokens=8,
                  threads=args.threads, seed=args.seed, steps=args.steps)  # fmt: skip
    full = run_pipeline(
        "full", work / "up-full", args.steps, pipeline_overrides(lr=args.full_lr, **common)
    )
    lora_sets = [*pipeline_overrides(lr=args.lora_lr, **common), "trainer.lora.enabled=true",
                 f"trainer.lora.r={args.r}", f"trainer.lora.alpha={2 * args.r}"]  # fmt: skip
    lora = run_pipeline("lora", work / "up-lora", args.steps, lora_sets)
    out = {}
    for s in (full, lora):
        first, last = s.reward_first(args.window), s.reward_last(args.window)
        out[s.name] = {"reward_first": first, "reward_last": last, "gain": last - first,
                       "steps_per_s": s.steps_per_s()}  # fmt: skip
    out["gain_ratio"] = out["lora"]["gain"] / out["full"]["gain"] if out["full"]["gain"] else None
    return out


def main(argv: list[str] | None = None) -> None:
    import torch

    from bench.vs_trl import build_10x

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        work = Path(tmp)
        info = build_10x(TINY_MODEL, work / "model-10x", args.seed, args.sft_steps)
        print(f"10x model: {json.dumps(info)}", flush=True)
        results["model_10x"] = info
        full = measure_trainer(info["path"], work, False, args)
        lora = measure_trainer(info["path"], work, True, args)
        results.update(full=full, lora=lora)
        if not args.skip_reward:
            results["reward"] = reward_runs(work, args)
    results["environment"] = environment()
    write_json(args.out, results)
    report(results)


def report(r: dict[str, Any]) -> None:
    full, lora = r["full"], r["lora"]
    rows = [
        ("bytes per version", full["version_bytes"], lora["merge_version_bytes"]),
        ("publish -> applied s (merge)", full["publish_to_applied_s"],
         lora["merge_publish_to_applied_s"]),
        ("publish -> applied s (unmerged)", full["publish_to_applied_s"],
         lora["unmerged_publish_to_applied_s"]),
        ("hf generate tokens/s (merge)", full["generate_tokens_per_s"],
         lora["merge_generate_tokens_per_s"]),
        ("hf generate tokens/s (unmerged)", full["generate_tokens_per_s"],
         lora["unmerged_generate_tokens_per_s"]),
        ("trainer step s", full["step_s"], lora["step_s"]),
        ("optimizer state bytes", full["optimizer_bytes"], lora["optimizer_bytes"]),
        ("trainable parameters", full["trainable_params"], lora["trainable_params"]),
    ]  # fmt: skip
    print(f"{'':34} {'full':>14} {'lora':>14} {'lora/full':>10}")
    for name, a, b in rows:
        print(f"{name:34} {a:14.4g} {b:14.4g} {b / a:10.3f}")
    if "reward" in r:
        w = r["reward"]
        for kind in ("full", "lora"):
            k = w[kind]
            print(f"reward {kind}: first {k['reward_first']:.3f} last {k['reward_last']:.3f} "
                  f"gain {k['gain']:.3f} ({k['steps_per_s']:.2f} steps/s)")  # fmt: skip
    ratio = lora["merge_version_bytes"] / full["version_bytes"]
    gain = r.get("reward", {}).get("gain_ratio")
    gain_text = "n/a" if gain is None else f"{gain:.2f} (goal >= 0.80)"
    print(f"lora/full bytes per version {ratio:.3f} (goal <= 0.05); reward gain ratio {gain_text}")


if __name__ == "__main__":
    main()
