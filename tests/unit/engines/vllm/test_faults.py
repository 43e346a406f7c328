"""The vllm engine when things go wrong (real vLLM): a vLLM without the API the engine needs is
refused at start in one line; and in a whole `grpo-stream up` run a generator whose vLLM
worker is killed exits with the named error, is restarted under run.restarts, its leases are
re-dispatched and no group is trained twice. (A killed worker ending the engine's requests
with VLLMEngineDied is the last test of test_vllm_generator.py, on that module's engine.)

Run on the CPU build with `LD_PRELOAD=$VIRTUAL_ENV/lib/libiomp5.so pytest -m gpu ...`.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import sys
import time
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from grpo_stream.config import GeneratorSettings, ModelSettings
from grpo_stream.config.transport import SecuritySettings, TransportSettings

sys.path.insert(0, str(Path(__file__).parent))
from vllm_checks import vllm_worker_of

pytestmark = pytest.mark.gpu

E2E = Path(__file__).parents[3] / "e2e" / "conftest.py"
STEPS = 12


def e2e_helpers() -> ModuleType:
    """tests/e2e/conftest.py (Run, pid_of, the accounting checks), loaded by path."""
    spec = importlib.util.spec_from_file_location("e2e_helpers", E2E)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vllm_children() -> set[int]:
    """Live vLLM processes under this one (earlier modules' engines may linger as zombies)."""
    return {
        p.pid for p in psutil.Process().children(recursive=True)
        if "VLLM" in p.name() and p.status() != psutil.STATUS_ZOMBIE
    }  # fmt: skip


def test_a_vllm_without_the_api_the_engine_needs_is_refused_at_start_in_one_line(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("vllm")
    from vllm.v1.engine.async_llm import AsyncLLM

    from grpo_stream.engines.vllm.compat import UnsupportedVLLM
    from grpo_stream.engines.vllm.engine import VLLMEngine

    for cls in AsyncLLM.__mro__:  # as vLLM 0.26 and older lack it (its base class too)
        if "update_weight_version" in vars(cls):
            monkeypatch.delattr(cls, "update_weight_version")
    before = vllm_children()
    t0 = time.monotonic()
    with pytest.raises(UnsupportedVLLM, match=r"lacks AsyncLLM\.update_weight_version") as err:
        VLLMEngine.from_settings(
            ModelSettings(name_or_path=str(tiny_dir), dtype="float32"),
            GeneratorSettings(gpu_memory_utilization=0.05),
            TransportSettings(),
            SecuritySettings(),
        )
    assert "\n" not in str(err.value) and "vLLM >= 0.32.0" in str(err.value)
    assert time.monotonic() - t0 < 10  # refused before vLLM started anything
    assert vllm_children() == before  # no engine process was started


@pytest.mark.slow
def test_up_restarts_a_generator_whose_vllm_worker_died_and_trains_each_group_once(
    tmp_path: Path,
) -> None:
    pytest.importorskip("vllm")
    e2e = e2e_helpers()
    run = e2e.Run(
        tmp_path / "run", STEPS,
        "--set", "generator.engine=vllm", "--set", "generator.gpu_memory_utilization=0.05",
        "--set", "run.restarts=2", "--set", "trainer.throttle_s=0.3",
    )  # fmt: skip
    try:
        run.wait_steps(2, timeout=600)
        generator = e2e.pid_of(run.run_dir, "generator-0")
        vllm_worker_of(generator).send_signal(signal.SIGKILL)
        assert run.finish(timeout=900) == 0, run.output()[-3000:]
    finally:
        run.kill()
    lines = [line for path in (run.run_dir / "logs").glob("generator-generator-0.jsonl")
             for line in path.read_text().splitlines()]  # fmt: skip
    died = [json.loads(line) for line in lines if '"generator.engine_failed"' in line]
    assert died and "died" in died[0]["error"]
    joins = [e for e in e2e.hub_events(run.run_dir, "peer.joined")
             if e["instance"] == "generator-0"]  # fmt: skip
    assert len(joins) >= 2  # the restarted generator joined again and got work
    counters = e2e.assert_accounting(run.run_dir, STEPS)
    e2e.assert_exactly_once(run.run_dir, STEPS)
    lost = [e for e in e2e.hub_events(run.run_dir, "peer.lost") if e["instance"] == "generator-0"]
    assert counters["requeued_generate"] + counters["redispatched"] > 0 or lost
