"""The steps of bench/gpu_check.sh, each writing one JSON result (`--json-out FILE`) whose
"ok" says whether the step passed; `summary` prints the table, writes gpu_check.json and
exits non-zero when any step failed.

    python -P bench/gpu_check.py requirements --site DIR --bundle DIR [--cpu] --json-out F
    python -P bench/gpu_check.py nvml | fingerprint [--cpu] --json-out F
    python -P bench/gpu_check.py trainer | generate | publish [--cpu] [--model M] --json-out F
    python -P bench/gpu_check.py up --work DIR [--cpu] [--model M] --json-out F
    python -P bench/gpu_check.py summary --work DIR [--out DIR]

It is run as a script (`-P`: not even bench/ on sys.path), with PYTHONPATH holding only the
folder the bundle was installed into, so everything it imports from grpo_stream is the
INSTALLED package; `requirements` checks that, and that every requirement of grpo-stream
(recursively) is met by what is installed. The trainer step trains the same log-normal
batches in fp32, bf16-mixed and bf16 and reports loss agreement, tokens/s, peak device
memory and MFU (6 x parameters x tokens/s over the GPU's peak bf16 tensor FLOPS from the
fingerprint's derivation). `--cpu` runs every step on the CPU with smaller sizes: the
rehearsal of tests/unit/bench/test_gpu_check.py, on hosts without a GPU. The steps that
inspect the host (requirements, nvml, fingerprint) are bench/gpu_check_host.py, loaded from
beside this file.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

GROUP = 8


def _beside(name: str) -> ModuleType:
    """A module in this script's folder, loaded by its path: run with -P, bench/ is not on
    sys.path (so grpo_stream can only come from the installed bundle)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_host = _beside("gpu_check_host")
requirements, nvml, fingerprint = _host.requirements, _host.nvml, _host.fingerprint


# ----- the trainer, the hf generator and publishing -------------------------------------
def group_of(rng: Any, gid: int, prompt: int, lengths: Any, logprob: float | None = None) -> Any:
    """One scored group as the hub holds it: a `prompt`-token prompt and completions of
    `lengths`, token ids in 3..249, rewards uniform in [0, 1), behaviour log-probs `logprob`
    (None: uniform in -4..-3)."""
    import numpy as np

    from grpo_stream.hub.replay import Group
    from grpo_stream.protocols.messages import SamplingParams

    size = len(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rewards = rng.random(size).astype(np.float32)
    total = int(offsets[-1])
    logprobs = -rng.random(total) - 3.0 if logprob is None else np.full(total, logprob)
    return Group(
        group_id=gid,
        policy_version=0,
        prompt_ids=rng.integers(3, 250, size=prompt).astype(np.int32),
        completion_ids=rng.integers(3, 250, size=total).astype(np.int32),
        completion_offsets=offsets,
        logprobs=logprobs.astype(np.float32),
        rewards=rewards,
        advantages=((rewards - rewards.mean()) / (rewards.std() + 1e-4)).astype(np.float32),
        valid=np.ones(size, dtype=bool),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=int(max(lengths))),
    )


def make_batch(seed: int, sequences: int, median: float, max_len: int) -> Any:
    """A TrainBatch of `sequences` completions (groups of 8) with log-normal lengths (sigma
    1, clipped to 16..max_len) and prompts of 8..24 tokens, as the hub builds it."""
    import numpy as np

    from grpo_stream.hub.batches import build_batch

    rng = np.random.default_rng(seed)
    groups = []
    for gid in range(max(1, sequences // GROUP)):
        raw = rng.lognormal(np.log(median), 1.0, size=GROUP)
        lengths = np.clip(raw.astype(np.int64), min(16, max_len), max_len)
        groups.append(group_of(rng, gid, int(rng.integers(8, 25)), lengths))
    return build_batch(1, groups)


def _state(ns: argparse.Namespace, precision: str, run_dir: Path) -> Any:
    from grpo_stream.config import load_config
    from grpo_stream.training.state import TrainState

    sets = [
        f"run.run_dir={json.dumps(str(run_dir))}",
        f"model.name_or_path={json.dumps(ns.model)}",
        f'trainer.device="{ns.device}"',
        f'trainer.precision="{precision}"',
        f"generator.max_tokens={ns.max_len}",
        "trainer.micro_batch_tokens=8192",
        "trainer.micro_batch=4096",
    ]
    return TrainState.create(load_config(None, sets))


def peak_tflops() -> float | None:
    """Peak bf16 tensor TFLOPS of GPU 0 as the fingerprint derives it (None if unknown)."""
    from grpo_stream.hardware.fingerprint import fingerprint_host

    devices = fingerprint_host(benchmark=False).devices
    return devices[0].tensor_tflops if devices and devices[0].kind == "gpu" else None


def _train(
    ns: argparse.Namespace, precision: str, batches: list[Any], tokens: int
) -> dict[str, Any]:
    """One precision's losses, tokens/s (steps after the first) and peak device memory."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        state = _state(ns, precision, Path(tmp))
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
            losses.append(float(result.metrics.get("loss", math.nan)))
        params = sum(p.numel() for p in state.model.parameters())
    return {
        "tokens_per_s": tokens / seconds,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "losses": losses,
        "parameters": params,
    }


def trainer(ns: argparse.Namespace) -> dict[str, Any]:
    batches = [make_batch(s, ns.sequences, ns.median, ns.max_len) for s in range(ns.steps + 1)]
    tokens = sum(len(b.input_ids) for b in batches[1:])
    tflops = None if ns.device == "cpu" else peak_tflops()
    out: dict[str, Any] = {}
    for precision in ("fp32", "bf16-mixed", "bf16"):
        side = _train(ns, precision, batches, tokens)
        rate = side["tokens_per_s"]
        side["mfu"] = 6 * side["parameters"] * rate / (tflops * 1e12) if tflops else None
        out[precision] = side
    first = out["fp32"]["losses"][0]
    for precision in ("bf16-mixed", "bf16"):
        other = out[precision]["losses"][0]
        out[f"loss_rel_diff_{precision}"] = abs(first - other) / max(abs(first), 1e-12)
    finite = all(math.isfinite(x) for p in ("fp32", "bf16-mixed", "bf16") for x in out[p]["losses"])
    return {"ok": finite, **out}


def generate(ns: argparse.Namespace) -> dict[str, Any]:
    from grpo_stream.engines.hf import HFEngine
    from grpo_stream.models.loading import load_policy, load_tokenizer
    from grpo_stream.sampling import Sampling

    tokenizer = load_tokenizer(ns.model)
    model = load_policy(ns.model, device=ns.device, trainable=False)
    engine = HFEngine(model, tokenizer, device=ns.device)
    engine.generate(["1+2="], group_size=8, sampling=Sampling(max_tokens=8, seed=0))  # warm-up
    prompts = ["3+4=", "5+6="] * ns.prompts
    t0 = time.perf_counter()
    groups = engine.generate(prompts, group_size=8, sampling=Sampling(max_tokens=ns.new_tokens))
    seconds = time.perf_counter() - t0
    completions = sum(len(g.completions) for g in groups)
    tokens = sum(len(c.token_ids) for g in groups for c in g.completions)
    return {
        "ok": completions == 8 * len(prompts),
        "device": ns.device,
        "completions": completions,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
    }


def publish(ns: argparse.Namespace) -> dict[str, Any]:
    """Device -> host staging of the full weights, as the trainer publishes them."""
    import torch

    from grpo_stream.transport.weights import snapshot_arrays

    with tempfile.TemporaryDirectory() as tmp:
        state = _state(ns, "auto", Path(tmp))
        nbytes = sum(t.numel() * t.element_size() for t in state.model.state_dict().values())
        rates = []
        for _ in range(3):
            if state.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            snapshot_arrays(state.named_weights())
            rates.append(nbytes / 2**30 / (time.perf_counter() - t0))
        staged = state.staging is not None
    return {
        "ok": staged == (ns.device == "cuda"),  # a GPU trainer stages through pinned memory
        "gib": nbytes / 2**30,
        "gib_per_s": max(rates),
        "staged": staged,
    }


# ----- a short run ----------------------------------------------------------------------
def up(ns: argparse.Namespace) -> dict[str, Any]:
    """`grpo-stream up` of the installed package for ns.up_steps steps on this machine."""
    run_dir = Path(ns.work) / "up-run"
    sets = [f'trainer.device="{ns.device}"', f"model.name_or_path={json.dumps(ns.model)}"]
    cmd = [sys.executable, "-m", "grpo_stream.cli.main", "up", "--run-dir", str(run_dir)]
    cmd += ["--max-steps", str(ns.up_steps)] + [a for s in sets for a in ("--set", s)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=ns.timeout)
    seconds = time.perf_counter() - t0
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    rows = [json.loads(line) for line in lines if line.strip()]
    rewards = [r["reward_mean"] for r in rows if r.get("reward_mean") is not None]

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {
        "ok": done.returncode == 0 and len(rows) == ns.up_steps,
        "rc": done.returncode,
        "steps": len(rows),
        "seconds": seconds,
        "reward_first5": mean(rewards[:5]),
        "reward_last5": mean(rewards[-5:]),
        "staleness_mean": mean([r.get("staleness_mean") or 0.0 for r in rows]),
        "trainer_wait_s": mean([r.get("trainer_wait_s") or 0.0 for r in rows]),
        "stderr_tail": done.stderr[-1500:] if done.returncode else "",
    }


# ----- the summary ----------------------------------------------------------------------
def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def table_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(check, result) rows of the summary table."""
    rows = [(f"step {name}", "ok" if data[name].get("ok") else "FAILED") for name in data]
    req, fp = data.get("requirements", {}), data.get("fingerprint", {})
    rows += [("torch / CUDA", f"{_fmt(req.get('torch'))} / {_fmt(req.get('torch_cuda'))}")]
    rows += [("device", _fmt(fp.get("device", {}).get("name")))]
    t = data.get("trainer", {})
    for p in ("fp32", "bf16-mixed", "bf16"):
        side = t.get(p, {})
        rows.append((f"trainer {p} tokens/s", _fmt(side.get("tokens_per_s"))))
        rows.append(
            (
                f"trainer {p} peak GiB / MFU",
                f"{_fmt(side.get('peak_gib'))} / {_fmt(side.get('mfu'))}",
            )
        )
    for p in ("bf16-mixed", "bf16"):
        rows.append((f"first loss rel. diff {p} vs fp32", _fmt(t.get(f"loss_rel_diff_{p}"))))
    rows.append(("hf generate tokens/s", _fmt(data.get("generate", {}).get("tokens_per_s"))))
    pub = data.get("publish", {})
    rows.append(
        (
            "publish GiB/s (pinned staging)",
            f"{_fmt(pub.get('gib_per_s'))} ({_fmt(pub.get('staged'))})",
        )
    )
    u = data.get("up", {})
    rows.append(
        (
            "up steps, reward first5 -> last5",
            f"{_fmt(u.get('steps'))}, "
            f"{_fmt(u.get('reward_first5'))} -> {_fmt(u.get('reward_last5'))}",
        )
    )
    for name in data:
        for problem in data[name].get("problems", []):
            rows.append((f"{name} problem", problem))
    return rows


def _results(work: Path) -> dict[str, Any]:
    """Each step that ran (WORK/rc.txt, in order): its JSON, its exit status and whether it
    passed (exit 0 and "ok"); a failed step's log tail."""
    data: dict[str, Any] = {}
    for line in (work / "rc.txt").read_text().splitlines():
        name, rc = line.split()
        path = work / f"{name}.json"
        try:
            result = json.loads(path.read_text()) if path.exists() else {}
        except json.JSONDecodeError as exc:
            result = {"ok": False, "error": f"{path.name} is not JSON: {exc}"}
        result["rc"] = int(rc)
        result["ok"] = int(rc) == 0 and result.get("ok", True) is True
        if not result["ok"]:
            log = work / f"{name}.log"
            result["log_tail"] = log.read_text()[-1500:] if log.exists() else ""
        data[name] = result
    return data


def summary(ns: argparse.Namespace) -> int:
    """The table, gpu_check.json (and nvml_record.json) under --out; 1 if a step failed."""
    data = _results(Path(ns.work))
    failed = [name for name, result in data.items() if not result["ok"]]
    out = Path(ns.out) if ns.out else Path(ns.work)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps({**data, "failed": failed}, indent=1))
    record = data.get("nvml", {}).get("record")
    if record is not None:
        (out / "nvml_record.json").write_text(json.dumps(record, indent=2) + "\n")
    print("| check | result |\n| --- | --- |")
    for check, result in table_rows(data):
        print(f"| {check} | {result} |")
    verdict = f"FAILED: {', '.join(failed)}" if failed else "all steps passed"
    print(f"gpu_check: {verdict}; {out / 'gpu_check.json'}")
    return 1 if failed or not data else 0


PARTS = {
    "requirements": requirements,
    "nvml": nvml,
    "fingerprint": fingerprint,
    "trainer": trainer,
    "generate": generate,
    "publish": publish,
    "up": up,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -P bench/gpu_check.py")
    p.add_argument("part", choices=[*PARTS, "summary"])
    p.add_argument("--cpu", action="store_true", help="the CPU rehearsal (smaller sizes)")
    p.add_argument("--model", default="grpo-stream/tiny-arith")
    p.add_argument("--json-out", default=None, help="write the step's JSON here")
    p.add_argument("--site", default=None, help="requirements: where the bundle is installed")
    p.add_argument("--bundle", default=None, help="requirements: the bundle (bundle.json)")
    p.add_argument("--work", default=".", help="up, summary: the work folder")
    p.add_argument("--out", default=None, help="summary: where gpu_check.json goes")
    p.add_argument("--timeout", type=float, default=150.0, help="fingerprint, up: seconds")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    if ns.part == "summary":
        return summary(ns)
    # sizes: the GPU run, or the CPU rehearsal's (minutes on two shared cores)
    gpu = not ns.cpu
    ns.device = "cuda" if gpu else "cpu"
    ns.steps, ns.sequences = (3, 64) if gpu else (1, 16)
    ns.median, ns.max_len = (64.0, 512) if gpu else (24.0, 48)
    ns.prompts, ns.new_tokens = (8, 32) if gpu else (2, 8)
    ns.up_steps = 30 if gpu else 3
    result = PARTS[ns.part](ns)
    text = json.dumps(result, indent=1, default=str)
    if ns.json_out:
        Path(ns.json_out).write_text(text)
    print(text)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
