"""CPU micro-benchmarks measured once per host boot and shared through a locked cache file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_stream.hardware import cpu_cache
from grpo_stream.hardware.cpu import CpuRates
from grpo_stream.hardware.fingerprint import fingerprint_host


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record each real measurement the cache makes."""
    calls: list[float] = []
    real = cpu_cache.measure

    def measure(seconds: float) -> CpuRates:
        calls.append(seconds)
        return real(seconds)

    monkeypatch.setattr(cpu_cache, "measure", measure)
    return calls


def test_second_call_reads_the_first_measurement(tmp_path: Path, counted: list[float]) -> None:
    path = tmp_path / "bench.json"
    first = cpu_cache.host_rates(0.01, path)
    second = cpu_cache.host_rates(0.01, path)
    assert second == first
    assert counted == [0.01]


def test_another_benchmark_length_measures_again(tmp_path: Path, counted: list[float]) -> None:
    path = tmp_path / "bench.json"
    cpu_cache.host_rates(0.01, path)
    cpu_cache.host_rates(0.02, path)
    assert counted == [0.01, 0.02]


def test_a_corrupt_cache_is_measured_again_and_rewritten(
    tmp_path: Path, counted: list[float]
) -> None:
    path = tmp_path / "bench.json"
    path.write_text("{not json")
    rates = cpu_cache.host_rates(0.01, path)
    assert counted == [0.01]
    assert json.loads(path.read_text())["gflops_per_core"] == rates.gflops_per_core


def test_an_unwritable_cache_directory_still_measures(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    rates = cpu_cache.host_rates(0.01, blocker / "sub" / "bench.json")
    assert rates.gflops_per_core > 0 and rates.copy_gbps > 0


def test_processes_started_together_report_the_same_figures(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    code = (
        "import sys; from pathlib import Path; from grpo_stream.hardware import cpu_cache; "
        "r = cpu_cache.host_rates(0.05, Path(sys.argv[1])); print(r.gflops_per_core, r.copy_gbps)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(outputs) == 1, outputs  # measured once; independent measurements would differ


def test_host_fingerprint_uses_the_cached_figures(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    rates = cpu_cache.host_rates(0.01, path)
    device = fingerprint_host(seconds=0.01, cache=path).devices[0]
    assert device.memory_bandwidth_gbps == rates.copy_gbps
    assert device.fp32_tflops == pytest.approx(rates.gflops_per_core * device.cpu_cores / 1000)
