"""The steps of bench/gpu_scale.sh: grpo-stream at real model shapes on one GPU. Each step
writes one JSON result (`--json-out FILE`) whose "ok" says whether it passed; `summary`
prints the table, writes gpu_scale.json and exits non-zero when any step failed.

    python -P bench/gpu_scale.py trainer --shape 1.5B [--cpu] --work DIR --json-out F
    python -P bench/gpu_scale.py fsdp | profile | generate | publish | up [--shape S] ...
    python -P bench/gpu_scale.py summary --work DIR [--out DIR]

Run as a script (`-P`), grpo_stream comes from the installed bundle only (gpu_check.sh's
bundle and its `requirements` step); the modules beside this file are loaded by path:
gpu_shapes (shapes, FLOPs, MFU, bandwidth bound: the formulas are in its docstring),
gpu_scale_train (the trainer grid, FSDP2 on one rank, the precisions' profile) and
gpu_scale_serve (hf generation, publishing, a whole run). `--cpu` runs everything on the
CPU with the `tiny` shape and small sizes: the rehearsal that the slow suite runs.
Peaks: the device's dense bf16 TFLOPS and HBM GB/s from the datasheet table by its NVML
name, else the fingerprint's derivation; `--peak-tflops` / `--hbm-gbps` override them (the
CPU rehearsal passes nominal ones so the arithmetic runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def _beside(name: str) -> ModuleType:
    """A module in this script's folder, loaded by path and registered under its own name,
    so the others can import it (bench/ is not on sys.path under -P)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


shapes = _beside("gpu_shapes")
check = _beside("gpu_check")
train = _beside("gpu_scale_train")
serve = _beside("gpu_scale_serve")

PARTS = {
    "requirements": check.requirements,
    "trainer": train.trainer,
    "fsdp": train.fsdp,
    "profile": train.profile,
    "generate": serve.generate,
    "publish": serve.publish,
    "up": serve.up,
}


def device_peaks(ns: argparse.Namespace) -> None:
    """ns.device_name, ns.peak_tflops and ns.hbm_gbps: flags, else datasheet, else the
    fingerprint's derivation (None on a CPU)."""
    ns.device_name = None
    if ns.device.startswith("cuda"):
        from grpo_stream.hardware.fingerprint import fingerprint_host

        devices = fingerprint_host(benchmark=False).devices
        gpu = devices[0] if devices and devices[0].kind == "gpu" else None
        if gpu is not None:
            ns.device_name = gpu.name
            ns.peak_tflops = ns.peak_tflops or (
                shapes.datasheet(shapes.DATASHEET_BF16_TFLOPS, gpu.name) or gpu.tensor_tflops
            )
            ns.hbm_gbps = ns.hbm_gbps or (
                shapes.datasheet(shapes.DATASHEET_HBM_GBPS, gpu.name) or gpu.memory_bandwidth_gbps
            )


# ----- the summary ------------------------------------------------------------------------
def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else str(value)


def _cell_row(c: dict[str, Any]) -> str:
    head = f"{c.get('shape', '')} {c['seq']} {c['layout']}{' ckpt' if c['ckpt'] else ''}"
    if c.get("skipped"):
        return f"| {head} | not run ({c['skipped']}) | | | |"
    if c.get("oom"):
        return f"| {head} | out of memory | | {_fmt(c.get('peak_gib'))} | |"
    mfu = c.get("mfu")
    return (
        f"| {head} ({c.get('ran')}) | {_fmt(c.get('tokens_per_s'))} | "
        f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} | {_fmt(c.get('peak_gib'))} | "
        f"{_fmt(c.get('snapshot_s'))} |"
    )


def table(data: dict[str, Any]) -> list[str]:
    """The summary's Markdown lines."""
    lines = ["| step | result |", "| --- | --- |"]
    lines += [f"| {name} | {'ok' if r.get('ok') else 'FAILED'} |" for name, r in data.items()]
    lines += ["", "| trainer cell (layout run) | tokens/s | MFU | peak GiB | restore point s |"]
    lines += ["| --- | --- | --- | --- | --- |"]
    for name, result in data.items():
        if name.startswith("trainer"):
            shape = result.get("shape")
            lines += [_cell_row({"shape": shape, **c}) for c in result.get("cells", [])]
    fs = data.get("fsdp", {})
    lines += ["", f"FSDP2 (one rank) / plain step time: {_fmt(fs.get('fsdp2_over_plain'))}"]
    for name, result in data.items():
        if name.startswith("generate"):
            for r in result.get("runs", []):
                lines.append(
                    f"hf generate {result.get('shape')} batch {r['batch']}: "
                    f"{_fmt(r['tokens_per_s'])} tokens/s, "
                    f"{_fmt(r['of_bound'])} of the bandwidth bound"
                )
    pub = data.get("publish", {})
    for v in pub.get("versions", [])[:4]:
        lines.append(
            f"publish {pub.get('shape')} v{v['version']}: {_fmt(v['gib'])} GiB, snapshot "
            f"{_fmt(v['snapshot_gib_per_s'])} GiB/s, publish -> generator applied "
            f"{_fmt(v['publish_to_applied_s'])} s ({_fmt(v['gib_per_s_publish_to_applied'])} GiB/s)"
        )
    u = data.get("up", {})
    lines.append(
        f"up {u.get('shape')}: {_fmt(u.get('steps'))} steps, {_fmt(u.get('steps_per_s'))} steps/s, "
        f"peak memory {_fmt(u.get('peak_memory_gib'))} GiB, nothing lost: {u.get('nothing_lost')}"
    )
    prof = data.get("profile", {})
    for p in ("bf16-mixed", "bf16"):
        lines.append(f"fp32 / {p} tokens/s on gpu_check's step: {_fmt(prof.get(f'fp32_over_{p}'))}")
    return lines


def summary(ns: argparse.Namespace) -> int:
    """The table, gpu_scale.json under --out; 1 if a step failed or none ran."""
    data = check._results(Path(ns.work))
    failed = [name for name, result in data.items() if not result["ok"]]
    out = Path(ns.out) if ns.out else Path(ns.work)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_scale.json").write_text(json.dumps({**data, "failed": failed}, indent=1))
    print("\n".join(table(data)))
    verdict = f"FAILED: {', '.join(failed)}" if failed else "all steps passed"
    print(f"gpu_scale: {verdict}; {out / 'gpu_scale.json'}")
    return 1 if failed or not data else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -P bench/gpu_scale.py")
    p.add_argument("part", choices=[*PARTS, "summary"])
    p.add_argument("--cpu", action="store_true", help="the CPU rehearsal (tiny shape)")
    p.add_argument("--shape", default="0.5B", choices=sorted(shapes.SHAPES))
    p.add_argument("--seqs", default=None, help="trainer: sequence lengths, comma-separated")
    p.add_argument("--max-cells", type=int, default=0, help="trainer: at most this many cells")
    p.add_argument("--json-out", default=None)
    p.add_argument("--site", default=None, help="requirements: where the bundle is installed")
    p.add_argument("--bundle", default=None, help="requirements: the bundle (bundle.json)")
    p.add_argument("--work", default=".", help="the work folder (models, runs)")
    p.add_argument("--out", default=None, help="summary: where gpu_scale.json goes")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds this step may take")
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--hbm-gbps", type=float, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    if ns.part == "summary":
        return summary(ns)
    gpu = not ns.cpu
    ns.device = "cuda" if gpu else "cpu"
    if ns.cpu:
        ns.shape = "tiny"
    # sizes: the GPU run's, or the CPU rehearsal's (a minute or two on two shared cores)
    # (the rehearsal keeps its own sizes even where the script names a GPU length: a step's
    # micro-batch of 512 tokens must hold the longest sequence)
    seqs = (ns.seqs or "4096,1024") if gpu else "128,64"
    ns.seqs = [int(s) for s in seqs.split(",")]
    ns.prompt = 128 if gpu else 16
    ns.step_tokens = 32768 if gpu else 1024
    ns.micro_tokens = 8192 if gpu else 512
    ns.steps = 2 if gpu else 1
    ns.gen_prompts = (8, 16, 32) if gpu else (1, 2)
    ns.new_tokens = 128 if gpu else 8
    ns.up_steps, ns.publish_steps = (20, 6) if gpu else (3, 3)
    ns.model_tiny = "grpo-stream/tiny-arith"
    device_peaks(ns)
    result = PARTS[ns.part](ns)
    text = json.dumps(result, indent=1, default=str)
    if ns.json_out:
        Path(ns.json_out).write_text(text)
    print(text[-4000:])
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
