"""LoRA vs full fine-tuning: what a version weighs, how fast it is applied, what a trainer
step and its optimizer cost, and the reward reached at equal steps (with an lr search).

Part 1 (`--part weights`, in this process, on the 10x model of bench.vs_trl, built in a
temporary directory):
- bytes per published version (the snapshot the weight server serves), LoRA vs full, and
  the adapter's bytes at each of --byte-ranks;
- publish -> applied seconds: WeightServer.publish, then an hf engine's update_from_server
  over loopback ZeroMQ (median of --repeats), LoRA (merge and unmerged modes) vs full;
- hf engine generation with the adapter merged vs unmerged (tokens/s, after one warm-up);
- trainer step time (median of --repeats steps on one synthetic batch, full and LoRA steps
  interleaved so that other load on the machine hits both alike), optimizer state bytes
  (AdamW moments) and rollback snapshot bytes, LoRA vs full.
Part 2 (`--part reward`, `grpo-stream up` on the shipped tiny model, same threads and seed
for every run): mean reward of the first and last --window steps after --steps steps, full
fine-tuning at --full-lr and LoRA at each of --lora-lrs; each LoRA run's gain as a fraction
of the full run's gain, and the best lr.

Run: python -m bench.lora [--part all|weights|reward] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    TINY_MODEL,
    add_smoke,
    environment,
    parse,
    pipeline_overrides,
    ran_with,
    run_pipeline,
)
from bench.common import save_json as write_json

PROMPTS = ["12+34=", "7+8=", "50+25=", "3+4="]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="up steps per reward run")
    parser.add_argument("--window", type=int, default=10, help="steps averaged for rewards")
    parser.add_argument("--full-lr", type=float, default=1e-4)
    parser.add_argument("--lora-lrs", type=_floats, default=[1e-3, 2e-3, 3e-3],
                        help="comma-separated LoRA lrs searched")  # fmt: skip
    parser.add_argument("--lora-set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra --set for the LoRA runs")  # fmt: skip
    parser.add_argument("--r", type=int, default=16, help="LoRA rank")
    parser.add_argument("--byte-ranks", type=_ints, default=[4, 8, 16, 32])
    parser.add_argument("--part", choices=["all", "weights", "reward"], default="all")
    parser.add_argument("--size", choices=["10x", "tiny"], default="10x",
                        help="the weights part: a built 10x model or the tiny one")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sft-steps", type=int, default=0, help="10x model warm start")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "lora.json")
    add_smoke(parser)
    return parse(parser, argv, SMOKE)


SMOKE = ["--steps", "2", "--window", "1", "--lora-lrs", "2e-3", "--byte-ranks", "4",
         "--repeats", "1", "--size", "tiny", "--out", "{tmp}/lora.json"]  # fmt: skip


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


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


def measure_trainers(model: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Step time, optimizer and rollback snapshot bytes, version bytes and publish->applied
    for full fine-tuning and LoRA; the two trainers' steps alternate."""
    import torch

    from grpo_stream.training.state import TrainState

    states = {kind: TrainState.create(_config(model, work / kind, kind == "lora", args.r))
              for kind in ("full", "lora")}  # fmt: skip
    batch = _batch(args.seed)
    times: dict[str, list[float]] = {kind: [] for kind in states}
    cpu: dict[str, list[float]] = {kind: [] for kind in states}  # steadier on a shared box
    for _ in range(args.repeats + 1):  # the first step of each warms up
        for kind, state in states.items():
            t0, c0 = time.perf_counter(), time.process_time()
            if not state.train_step(batch).applied:
                raise RuntimeError(f"{kind}: the synthetic step was not applied")
            times[kind].append(time.perf_counter() - t0)
            cpu[kind].append(time.process_time() - c0)
    out: dict[str, Any] = {}
    for kind, state in states.items():
        out[kind] = {
            "step_s": statistics.median(times[kind][1:]),
            "step_s_all": times[kind],
            "step_cpu_s": statistics.median(cpu[kind][1:]),
            "optimizer_bytes": _optimizer_bytes(state.optimizer),
            "rollback_snapshot_bytes": state.guard.snapshot_bytes,
            "state_dict_bytes": _tensor_bytes(state.model.state_dict().values()),
            "trainable_params": sum(p.numel() for p in state.model.parameters() if p.requires_grad),
        }
        modes = [True, False] if kind == "lora" else [None]
        for merge in modes:
            key = "" if merge is None else ("merge_" if merge else "unmerged_")
            measured = _publish_apply(state, model, merge, args)
            out[kind].update({key + k: v for k, v in measured.items()})
            torch.set_num_threads(args.threads)
    return out


def _tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def adapter_bytes_by_rank(model: str, ranks: list[int]) -> dict[int, int]:
    """Bytes of a published adapter version (tensors and manifest) at each rank, default
    targets, on `model` (loaded in float32 as the trainer does)."""
    from grpo_stream.config.lora import LoraSettings
    from grpo_stream.models.loading import load_policy
    from grpo_stream.training.lora import wrap_policy

    out = {}
    for r in ranks:
        base = load_policy(model, dtype="float32")
        wrapped, policy = wrap_policy(base, LoraSettings(enabled=True, r=r, alpha=2 * r),
                                      model, None)  # fmt: skip
        out[r] = _tensor_bytes(t for _, t in policy.named_weights(wrapped))
    return out


QWEN2_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                tie_word_embeddings=False)  # fmt: skip
"""Qwen2.5-7B's shapes (from its published config), for the adapter fraction at that size."""


def adapter_fraction_7b(r: int) -> dict[str, float]:
    """Adapter vs model parameters for Qwen2.5-7B's shapes at rank r (default targets),
    counted from the layers peft builds on the meta device: shapes only, no weights."""
    import torch
    from peft import get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_stream.config.lora import LoraSettings
    from grpo_stream.models.adapter import lora_config

    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_7B))
        total = sum(p.numel() for p in model.parameters())
        wrapped = get_peft_model(model, lora_config(LoraSettings(enabled=True, r=r)))
        adapter = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    return {"r": r, "model_params": total, "adapter_params": adapter, "fraction": adapter / total}


def _publish_apply(
    state: Any, model: str, merge: bool | None, args: argparse.Namespace
) -> dict[str, Any]:
    import zmq

    from grpo_stream.config.transport import SecuritySettings, TransportSettings
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.engines.lora import HFAdapter
    from grpo_stream.models.loading import load_policy, load_tokenizer
    from grpo_stream.sampling import Sampling
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
        engine.generate(PROMPTS, group_size=2, sampling=Sampling(max_tokens=4, seed=1))  # warm-up
        t0 = time.perf_counter()
        groups = engine.generate(PROMPTS, group_size=8, sampling=Sampling(max_tokens=16, seed=0))
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
    """Full fine-tuning at --full-lr, then LoRA at each of --lora-lrs, on the tiny model."""
    common = dict(model=TINY_MODEL, group_size=8, prompts_per_step=16, max_tokens=8,
                  threads=args.threads, seed=args.seed, steps=args.steps)  # fmt: skip
    lora_sets = ["trainer.lora.enabled=true", f"trainer.lora.r={args.r}",
                 f"trainer.lora.alpha={2 * args.r}", *args.lora_set]  # fmt: skip
    runs = [("full", args.full_lr, [])] + [("lora", lr, lora_sets) for lr in args.lora_lrs]
    out: dict[str, Any] = {"runs": []}
    for kind, lr, extra in runs:
        name = f"{kind} lr={lr:g}"
        sets = [*pipeline_overrides(lr=lr, **common), *extra]
        run_dir = work / f"up-{kind}-{lr:g}"
        s = run_pipeline(name, run_dir, args.steps, sets)
        ran_with(run_dir, "trainer.lora.enabled", kind == "lora")
        first, last = s.reward_first(args.window), s.reward_last(args.window)
        out["runs"].append({"kind": kind, "lr": lr, "reward_first": first, "reward_last": last,
                            "gain": last - first, "steps_per_s": s.steps_per_s(),
                            "total_s": s.total_s, "rewards": s.rewards})  # fmt: skip
        print(f"{name}: reward first {first:.3f} last {last:.3f}", flush=True)
    full_gain = out["runs"][0]["gain"]
    for run in out["runs"][1:]:
        run["gain_ratio"] = run["gain"] / full_gain if full_gain > 0 else None
    best = max(out["runs"][1:], key=lambda run: run["gain"])
    out.update(best_lora_lr=best["lr"], gain_ratio=best["gain_ratio"])
    return out


def main(argv: list[str] | None = None) -> None:
    import torch

    from bench.vs_trl import build_10x
    from bench.vs_trl_model import count_parameters
    from grpo_stream.models.loading import resolve_model

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        work = Path(tmp)
        if args.part in ("all", "weights"):
            if args.size == "10x":
                info = build_10x(TINY_MODEL, work / "model-10x", args.seed, args.sft_steps)
            else:
                path = str(resolve_model(TINY_MODEL))
                info = {"path": path, "parameters": count_parameters(path)}
            print(f"{args.size} model: {json.dumps(info)}", flush=True)
            results[f"model_{args.size}"] = info
            results.update(measure_trainers(info["path"], work, args))
            results["adapter_bytes_by_rank"] = adapter_bytes_by_rank(info["path"], args.byte_ranks)
            results["qwen2_7b_shapes"] = adapter_fraction_7b(args.r)
        if args.part in ("all", "reward"):
            results["reward"] = reward_runs(work, args)
    results["environment"] = environment()
    write_json(args.out, results)
    report(results)


def report(r: dict[str, Any]) -> None:
    if "full" in r:
        report_weights(r)
    if "reward" in r:
        report_reward(r["reward"])


def report_weights(r: dict[str, Any]) -> None:
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
        ("trainer step s (wall)", full["step_s"], lora["step_s"]),
        ("trainer step s (process CPU)", full["step_cpu_s"], lora["step_cpu_s"]),
        ("optimizer state bytes", full["optimizer_bytes"], lora["optimizer_bytes"]),
        ("rollback snapshot bytes", full["rollback_snapshot_bytes"],
         lora["rollback_snapshot_bytes"]),
        ("trainable parameters", full["trainable_params"], lora["trainable_params"]),
    ]  # fmt: skip
    print(f"{'10x model':34} {'full':>14} {'lora':>14} {'lora/full':>10}")
    for name, a, b in rows:
        print(f"{name:34} {a:14.4g} {b:14.4g} {b / a:10.3f}")
    for rank, size in r["adapter_bytes_by_rank"].items():
        ratio = size / full["version_bytes"]
        mark = "meets" if ratio <= 0.05 else "misses"
        print(f"adapter r={rank:<3} {size:12d} bytes = {ratio:.3f} of full ({mark} <= 0.05)")
    q = r["qwen2_7b_shapes"]
    print(
        f"Qwen2.5-7B shapes, r={q['r']}: adapter {q['adapter_params']:.4g} of "
        f"{q['model_params']:.4g} parameters = {q['fraction']:.4f} (bytes alike, one dtype)"
    )


def report_reward(w: dict[str, Any]) -> None:
    print(f"{'tiny model, up':24} {'lr':>8} {'first':>7} {'last':>7} {'gain':>7} "
          f"{'vs full':>8} {'steps/s':>8}")  # fmt: skip
    for run in w["runs"]:
        ratio = run.get("gain_ratio")
        ratio_text = "" if ratio is None else f"{ratio:8.2f}"
        print(f"{run['kind']:24} {run['lr']:8.0e} {run['reward_first']:7.3f} "
              f"{run['reward_last']:7.3f} {run['gain']:7.3f} {ratio_text:>8} "
              f"{run['steps_per_s']:8.2f}")  # fmt: skip
    ratio = w["gain_ratio"]
    text = "n/a" if ratio is None else f"{ratio:.2f}"
    print(f"best LoRA lr {w['best_lora_lr']:g}: reward gain {text} of full (goal >= 0.80)")


if __name__ == "__main__":
    main()
