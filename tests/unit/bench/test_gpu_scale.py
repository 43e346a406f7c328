"""bench/gpu_scale.sh, bench/gpu_scale.py and the modules beside it.

The fast tests hold the arithmetic to references: parameter counts to transformers' own
models of the same shapes (built on the meta device), the dense and attention FLOPs of a
step to torch's FLOP counter on a real forward and backward, the KV bytes of a decode step
to the cache a real model keeps; and the summary to its rules (an out-of-memory cell is a
measurement, a failed step fails the run after the table).
The CPU rehearsal (slow): `gpu_scale.sh --cpu` end to end in the rehearsed GPU image
(tests/unit/bench/rehearsal.py), every step on the installed package.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from bench import gpu_shapes

sys.path.insert(0, str(Path(__file__).parent))
from rehearsal import Image, run_script

REPO = Path(__file__).resolve().parents[3]
SCALE = REPO / "bench" / "gpu_scale.sh"
PARTS = REPO / "bench" / "gpu_scale.py"


def _model(shape: gpu_shapes.Shape, **kwargs: Any) -> Any:
    return Qwen2ForCausalLM(Qwen2Config(**shape.config(), **kwargs))


@pytest.mark.parametrize("name", ["0.5B", "1.5B", "3B", "tiny"])
def test_parameter_counts_are_transformers_own(name: str) -> None:
    shape = gpu_shapes.SHAPES[name]
    with torch.device("meta"):
        model = _model(shape)
    assert shape.parameters == sum(p.numel() for p in model.parameters())


def test_qwen25_shapes_have_their_published_sizes() -> None:
    sizes = {n: gpu_shapes.SHAPES[n].parameters / 1e9 for n in ("0.5B", "1.5B", "3B")}
    assert sizes == pytest.approx({"0.5B": 0.494, "1.5B": 1.544, "3B": 3.086}, abs=0.001)


def _counted(shape: gpu_shapes.Shape, length: int) -> dict[str, int]:
    """torch's FLOP counter over one sequence's forward and backward (eager attention: the
    scores are plain batched matmuls over every (query, key) pair)."""
    torch.manual_seed(0)
    model = _model(shape, attn_implementation="eager")
    ids = torch.randint(3, 250, (1, length))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids).logits.sum().backward()
    return {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}


def test_the_dense_term_is_the_counted_projection_and_head_matmuls() -> None:
    shape, length = gpu_shapes.SHAPES["tiny"], 40
    counted = _counted(shape, length)
    dense = counted["aten.mm"] + counted["aten.addmm"]
    assert 6 * shape.matmul_params * length == dense


def test_the_attention_term_is_the_causal_lower_triangle_of_the_counted_scores() -> None:
    # eager attention computes all s^2 (query, key) pairs and masks afterwards; a causal
    # model needs the s(s+1)/2 of the lower triangle, diagonal included
    shape, length = gpu_shapes.SHAPES["tiny"], 40
    counted = _counted(shape, length)["aten.bmm"]
    step = gpu_shapes.StepTokens(0, ((length,),))
    attention = gpu_shapes.train_flops(shape, step) - 6 * shape.matmul_params * length
    assert attention == pytest.approx(counted * (length + 1) / (2 * length), rel=1e-12)


def test_a_groups_prompt_counts_once_in_the_model_tokens() -> None:
    step = gpu_shapes.StepTokens(prompt=10, completions=((5, 7), (3,)))
    assert step.sequence_tokens == 10 * 3 + 15 and step.model_tokens == 20 + 15


def test_a_decode_step_reads_the_weights_and_the_kv_cache_the_model_keeps() -> None:
    shape, batch, context = gpu_shapes.SHAPES["tiny"], 3, 9
    model = _model(shape).to(torch.bfloat16)
    ids = torch.randint(3, 250, (batch, context))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    kv = sum(
        layer.keys.numel() * layer.keys.element_size()
        + layer.values.numel() * layer.values.element_size()
        for layer in cache.layers
    )
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert gpu_shapes.decode_bytes(shape, batch, context) == weights + kv


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.5),
        ("NVIDIA H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", 835.5),
        ("NVIDIA H200", 989.5),
        ("NVIDIA H200 NVL", 835.5),
        ("NVIDIA L4", None),
    ],
)
def test_the_datasheet_peak_is_found_by_the_nvml_name(name: str, tflops: float | None) -> None:
    assert gpu_shapes.datasheet(gpu_shapes.DATASHEET_BF16_TFLOPS, name) == tflops


def test_mfu_is_model_flops_over_time_and_peak() -> None:
    assert gpu_shapes.mfu(5e14, 2.0, 1000.0) == pytest.approx(0.25)
    assert gpu_shapes.mfu(5e14, 2.0, None) is None


def _summary(work: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-P", str(PARTS), "summary", "--work", str(work), "--out", str(work)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_an_out_of_memory_cell_is_a_measurement_and_a_failed_step_fails(tmp_path: Path) -> None:
    cells = [
        {"seq": 4096, "layout": "packed", "ckpt": False, "ok": True, "oom": True, "peak_gib": 79.1},
        {"seq": 1024, "layout": "rows", "ckpt": False, "ok": True, "skipped": "time"},
    ]
    (tmp_path / "rc.txt").write_text("trainer-3B 0\nup 1\n")
    (tmp_path / "trainer-3B.json").write_text(
        json.dumps({"ok": True, "shape": "3B", "cells": cells})
    )
    (tmp_path / "up.json").write_text(json.dumps({"ok": False, "nothing_lost": False}))
    done = _summary(tmp_path)
    assert done.returncode == 1
    assert "| trainer-3B | ok |" in done.stdout and "| up | FAILED |" in done.stdout
    assert "| 3B 4096 packed | out of memory |" in done.stdout
    assert "| 3B 1024 rows | not run (time) |" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("gpu_scale: FAILED: up")


# ----- the CPU rehearsal ------------------------------------------------------------------
@pytest.fixture(scope="module")
def scaled(gpu_image: Image) -> dict[str, Any]:
    work = gpu_image.root / "scale-work"
    work.mkdir()
    t0 = time.perf_counter()
    # on the CPU every shape is the tiny one: the steps that would repeat another's work are
    # left out (publish is `up`'s log reading, which `up` does too; the other trainers and
    # generate-1.5B)
    only = "install,requirements,trainer-0.5B,fsdp,profile,generate-0.5B,up"
    done = run_script(SCALE, gpu_image, work, "--only", only, env_work="GPU_SCALE_WORK")
    print(f"gpu_scale rehearsal: {time.perf_counter() - t0:.0f} s")
    print("".join(line for line in done.stderr.splitlines(keepends=True) if "rc=" in line))
    data = json.loads((work / "out" / "gpu_scale.json").read_text())
    return {"done": done, "data": data, "work": work}


@pytest.mark.slow  # builds the rehearsed image (once a session) and runs every step: minutes
@pytest.mark.timeout(1800)
def test_gpu_scale_cpu_passes_end_to_end_on_the_installed_package(scaled: dict[str, Any]) -> None:
    done, data = scaled["done"], scaled["data"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert data["failed"] == []
    assert Path(data["requirements"]["grpo_stream"]).is_relative_to(scaled["work"] / "site")
    cells = [c for name in data if name.startswith("trainer") for c in data[name]["cells"]]
    ran = [c for c in cells if "step_s" in c]
    assert {(c["layout"], c["ckpt"]) for c in ran} == {
        ("packed", True),
        ("packed", False),
        ("rows", True),
        ("rows", False),
    }
    assert all(c["mfu"] > 0 and c["tokens_per_s"] > 0 and c["snapshot_s"] >= 0 for c in ran)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_gpu_scale_cpu_measures_fsdp_generation_publishing_and_a_whole_run(
    scaled: dict[str, Any],
) -> None:
    data = scaled["data"]
    assert data["fsdp"]["fsdp2"]["sharded"] and not data["fsdp"]["plain"]["sharded"]
    assert data["fsdp"]["fsdp2_over_plain"] > 0
    assert {"fp32", "bf16-mixed", "bf16"} <= data["profile"].keys()
    runs = data["generate-0.5B"]["runs"]
    assert [r["batch"] for r in runs] == [8, 16] and all(r["of_bound"] > 0 for r in runs)
    assert data["up"]["versions"] and data["up"]["median_publish_to_applied_s"] > 0
    assert data["up"]["steps"] == 3 and data["up"]["nothing_lost"]
    assert data["up"]["counters"]["trained"] > 0 and data["up"]["peak_memory_gib"] > 0
