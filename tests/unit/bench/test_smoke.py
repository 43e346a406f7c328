"""Benches that cannot rot: every bench runs its --smoke mode here, as a user would start it
(`python -m bench.NAME --smoke`), and must end with its result line, each side having run the
mode it is named for (the benches check that themselves and fail otherwise)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "bench" / "results"

SMOKE = {
    "async_vs_sync": r"^ratio async/sync steps/s: \d",
    "context_parallel": r"^time per token CP2/CP1 rank-seconds: \d",
    "ddp": r"^ratio after/overlap: \d",
    "distill": r"^distill reaches reward's final pass@1",
    "generate": r"speedup \d+\.\d+x$",
    "inflight": r"^steps/s inflight/between \d",
    "judge": r"^judge scores/s \d.* vs rule \d",
    "lora": r"^best LoRA lr \d.*reward gain \d",
    "loss": r"^ratio behaviour/bare \d",
    "multi_turn": r"^cost per token episodes/single: ",
    "off_policy": r"^staleness4 best/onpolicy gain ratio: ",
    "rewards": r"^reward calls/s before -> after: short \d+ -> \d+ .*gsm8k \d+ -> \d+",
    "soak": r"^\}$",  # its JSON summary; it exits 1 on any failure it found
    "step_parts": r"^step_parts: compute \d+\.\d ms, fixed \d",
    "trainer_tokens": r"^ratio packed/padded tokens/s: \d+\.\d+, shared/packed \d",
    "transport": r"^ratio codec/raw: \d",
    "vs_trl_step": r"^ratio packed/shared step seconds: \d",
    "weights": r"fanout2/fanout1 \d.*full GiB/s \d",
}
"""Each bench with a command line, and the pattern of the last line its smoke run prints."""

NOT_RUN = {
    "gpu_check": "needs CUDA: bench/gpu_check.sh's CPU rehearsal runs it (the slow suite)",
    "gpu_scale": "needs CUDA: bench/gpu_scale.sh's CPU rehearsal runs it "
    "(tests/unit/bench/test_gpu_scale.py, the slow suite)",
    "hub_sim": "a part of bench.hub_load (its simulated peers), started by it",
    "weights_receiver": "a part of bench.weights (one receiver), started by it",
    "hub_load": "smoke-run with and without authentication by tests/unit/bench/test_hub_load.py",
    "dashboard": "smoke-run by tests/unit/bench/test_dashboard_bench.py",
    "agents": "smoke-run by tests/unit/bench/test_agents_bench.py",
    "launch_to_step": "smoke-run by tests/unit/bench/test_launch_to_step.py",
    "dynamic_sampling": "smoke-run by tests/unit/bench/test_algos_benches.py",
    "curriculum": "real `up` runs, minutes: smoke-run by tests/unit/bench/test_curriculum_bench.py "
    "(slow)",
    "vllm_stream": "needs vLLM: smoke-run by tests/unit/engines/vllm/test_bench.py (-m gpu)",
    "vs_trl": "needs TRL (the bench extra): smoke-run (the workload matrix's) by "
    "tests/unit/bench/test_vs_trl_matrix.py when TRL is installed",
    "time_to_reward": "minutes of both sides and needs TRL: smoke-run by "
    "tests/unit/bench/test_time_to_reward.py (slow) when TRL is installed",
    "time_to_reward_runs": "its TRL child, started by bench.time_to_reward",
}
"""Benches with a `__main__` that this test does not start, each with why."""


def _entry_points() -> set[str]:
    return {p.stem for p in (REPO / "bench").glob("*.py") if "__main__" in p.read_text()}


def test_every_bench_is_smoke_run_or_says_why_not() -> None:
    assert _entry_points() == set(SMOKE) | set(NOT_RUN)
    assert not set(SMOKE) & set(NOT_RUN)


def _results() -> dict[str, float]:
    return {p.name: p.stat().st_mtime for p in RESULTS.iterdir()}


@pytest.mark.timeout(600)  # seconds quiet; several minutes on a loaded machine
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_smoke_run_ends_with_its_result_and_writes_no_results(name: str) -> None:
    before = _results()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BENCH_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=560,
        env=env,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines and re.search(SMOKE[name], lines[-1]), output[-3000:]
    assert _results() == before  # a smoke run never overwrites the committed results
