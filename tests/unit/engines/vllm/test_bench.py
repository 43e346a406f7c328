"""`python -m bench.vllm_stream --smoke` on a real vLLM: it runs the three sides and the
in-flight part, and every side samples the same completions (same per-group seeds)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[4]


def test_the_smoke_run_measures_every_side_and_ends_with_the_ratios(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    out = tmp_path / "smoke.json"
    got = subprocess.run(
        [sys.executable, "-m", "bench.vllm_stream", "--smoke", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=900, env=dict(os.environ),
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-3000:]
    last = got.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"stream/batch tokens/s \d+\.\d\d, ours/vllm-alone \d+\.\d\d", last)
    result = json.loads(out.read_text())
    (round_,) = result["throughput"]["rounds"]
    tokens = {side: round_[side]["tokens"] for side in ("stream", "batch", "vllm-alone")}
    if not torch.cuda.is_available():  # fp32 on the CPU: the same samples, token for token
        assert len(set(tokens.values())) == 1, tokens
    modes = result["inflight"]["modes"]
    assert set(modes) == {"between", "inflight"}
    assert all(row["trainer_wait_per_step_s"] >= 0 for row in modes.values())
