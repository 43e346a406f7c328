"""Pieces of bench/gpu_check.sh that need Python: the trainer on a GPU (fp32 vs bf16-mixed),
the hf generator on a GPU, and weights published from a GPU. Each prints one JSON line.

    python -m bench.gpu_check trainer --model M --steps 3 [--device cuda]
    python -m bench.gpu_check generate --model M [--device cuda]
    python -m bench.gpu_check publish --model M [--device cuda]

The trainer part trains the same batches (bench.trainer_tokens' log-normal lengths) in each
precision and reports loss agreement, tokens/s, peak device memory and MFU (6 x parameters x
tokens/s over the device's peak bf16 tensor FLOPS, from `grpo-stream fingerprint`'s
derivation, when known). It also runs on a CPU (--device cpu) so it is tested where no GPU is.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.trainer_tokens import make_batch


def _args(ns: argparse.Namespace) -> argparse.Namespace:
    """trainer_tokens' batch settings."""
    return argparse.Namespace(
        median=ns.median, sigma=1.0, min_len=16, max_len=ns.max_len, micro_batch_tokens=8192
    )


def _state(model: str, device: str, precision: str, run_dir: Path, max_len: int) -> Any:
    from grpo_stream.config import load_config
    from grpo_stream.training.state import TrainState

    return TrainState.create(
        load_config(
            None,
            [
                f"run.run_dir={json.dumps(str(run_dir))}",
                f"model.name_or_path={json.dumps(model)}",
                f'trainer.device="{device}"',
                f'trainer.precision="{precision}"',
                f"generator.max_tokens={max_len}",
                "trainer.micro_batch_tokens=8192",
                "trainer.micro_batch=4096",
            ],
        )
    )


def peak_tflops() -> float | None:
    """Peak bf16 tensor TFLOPS of GPU 0 as the fingerprint derives it (None if unknown)."""
    from grpo_stream.hardware.fingerprint import fingerprint_host

    devices = fingerprint_host(benchmark=False).devices
    return devices[0].tensor_tflops if devices and devices[0].kind == "gpu" else None


def trainer(ns: argparse.Namespace) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    batches = [make_batch(_args(ns), s, ns.sequences) for s in range(ns.steps + 1)]
    tokens = sum(len(b.input_ids) for b in batches[1:])
    for precision in ("fp32", "bf16-mixed", "bf16"):
        with tempfile.TemporaryDirectory() as tmp:
            state = _state(ns.model, ns.device, precision, Path(tmp), ns.max_len)
            params = sum(p.numel() for p in state.model.parameters())
            cuda = state.device.startswith("cuda")
            losses, seconds = [], 0.0
            for i, batch in enumerate(batches):
                if cuda:
                    torch.cuda.synchronize()
                    if i == 1:
                        torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                result = state.train_step(batch)
                if cuda:
                    torch.cuda.synchronize()
                if i:
                    seconds += time.perf_counter() - t0
                losses.append(float(result.metrics.get("loss", float("nan"))))
            rate = tokens / seconds
            peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
            out[precision] = {"tokens_per_s": rate, "peak_gib": peak, "losses": losses}
            tflops = peak_tflops() if cuda else None
            out[precision]["mfu"] = 6 * params * rate / (tflops * 1e12) if tflops else None
            out["parameters"] = params
    a, b = out["fp32"]["losses"][0], out["bf16-mixed"]["losses"][0]
    out["first_loss_rel_diff"] = abs(a - b) / max(abs(a), 1e-12)
    c = out["bf16"]["losses"][0]
    out["first_loss_rel_diff_bf16"] = abs(a - c) / max(abs(a), 1e-12)
    return out


def generate(ns: argparse.Namespace) -> dict[str, Any]:
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.models.loading import load_policy, load_tokenizer

    tokenizer = load_tokenizer(ns.model)
    model = load_policy(ns.model, device=ns.device, trainable=False)
    engine = HFEngine(model, tokenizer, device=ns.device)
    engine.generate(["1+2="], group_size=8, max_tokens=8, temperature=1.0, seed=0)  # warm-up
    t0 = time.perf_counter()
    groups = engine.generate(["3+4=", "5+6="] * 8, group_size=8, max_tokens=8, temperature=1.0)
    seconds = time.perf_counter() - t0
    completions = sum(len(g.completions) for g in groups)
    return {"device": ns.device, "completions": completions, "seconds": seconds}


def publish(ns: argparse.Namespace) -> dict[str, Any]:
    """Device -> host staging of the full weights, as the trainer publishes them."""
    import torch

    from grpo_stream.transport.weights import snapshot_arrays

    with tempfile.TemporaryDirectory() as tmp:
        state = _state(ns.model, ns.device, "auto", Path(tmp), ns.max_len)
        nbytes = sum(t.numel() * t.element_size() for t in state.model.state_dict().values())
        rates = []
        for _ in range(3):
            if state.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            snapshot_arrays(state.named_weights())
            rates.append(nbytes / 2**30 / (time.perf_counter() - t0))
    return {"gib": nbytes / 2**30, "gib_per_s": max(rates), "staged": state.staging is not None}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_check")
    p.add_argument("part", choices=["trainer", "generate", "publish"])
    p.add_argument("--model", default="grpo-stream/tiny-arith")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--sequences", type=int, default=64)
    p.add_argument("--median", type=float, default=64.0)
    p.add_argument("--max-len", type=int, default=512)
    ns = p.parse_args(argv)
    parts = {"trainer": trainer, "generate": generate, "publish": publish}
    print(json.dumps({ns.part: parts[ns.part](ns)}))


if __name__ == "__main__":
    main()
