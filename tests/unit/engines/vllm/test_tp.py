"""Tensor parallelism on the vllm engine (real vLLM, 2 workers, on the shipped tiny model: 2
attention heads, one per worker): a version is fetched once by the generator, both workers
load their shard of it from the one hand-off file, and generation then matches the new
weights exactly (a worker left on the old shard would not).

On CPU vLLM binds one thread set per worker: with a single NUMA node it needs them named
(`VLLM_CPU_OMP_THREADS_BIND`, one core each here). Needs 2 CPUs (or 2 GPUs).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_stream.config import GeneratorSettings, ModelSettings
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.sampling import Sampling

sys.path.insert(0, str(Path(__file__).parent))
from vllm_checks import max_logprob_error, perturbed_copy

pytestmark = pytest.mark.gpu

PROMPTS = ["1+2=", "12+34="]
MODEL = "grpo-stream/tiny-arith"


@pytest.fixture(scope="module")
def tp_engine() -> Iterator[Any]:
    pytest.importorskip("vllm")
    from grpo_stream.engines.vllm.engine import VLLMEngine

    on_gpu = torch.cuda.is_available()
    if (torch.cuda.device_count() if on_gpu else len(os.sched_getaffinity(0))) < 2:
        pytest.skip("tensor parallelism 2 needs 2 devices")
    mp = pytest.MonkeyPatch()
    if not on_gpu and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        cores = sorted(os.sched_getaffinity(0))
        mp.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{cores[0]}|{cores[1]}")
    try:
        engine = VLLMEngine.from_settings(
            ModelSettings(name_or_path=MODEL, dtype="auto" if on_gpu else "float32"),
            GeneratorSettings(gpu_memory_utilization=0.2 if on_gpu else 0.05, tensor_parallel=2),
            TransportSettings(),
            SecuritySettings(),
            max_model_len=64,
        )
    finally:
        mp.undo()
    yield engine
    engine.close()


def test_two_workers_load_one_fetch_of_each_version(tp_engine: Any) -> None:
    import zmq

    from grpo_stream.models.loading import load_policy
    from grpo_stream.transport.weights import WeightServer

    reference = load_policy(MODEL, dtype="float32", trainable=False)
    new = perturbed_copy(reference, seed=11)
    ctx: zmq.Context[Any] = zmq.Context()
    server = WeightServer(ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", TransportSettings(),
                          SecuritySettings())  # fmt: skip
    try:
        server.publish(1, new.named_parameters(remove_duplicate=False))
        assert tp_engine.update_from_server(server.addresses["weights"], -1) == 1
        assert server.served == 1 and tp_engine.updater.fetcher.fetches == 1
    finally:
        server.close()
        ctx.destroy(linger=0)
    groups = tp_engine.generate(PROMPTS, group_size=4, sampling=Sampling(max_tokens=8, seed=0))
    tolerance = 5e-2 if torch.cuda.is_available() else 1e-3
    assert max_logprob_error(groups, new) < tolerance
