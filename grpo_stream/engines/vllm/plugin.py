"""grpo-stream's vLLM plugin: names our weight-transfer backend in vLLM's registry.

vLLM runs every `vllm.general_plugins` entry point (pyproject: `grpo_stream =
"grpo_stream.engines.vllm.plugin:register"`) in each of its processes, workers included,
before a worker builds its weight-transfer backend. `register` registers the backend by module
path, so the backend's module (`vllm.worker`) is imported only where vLLM builds it. vLLM may
run plugins several times in one process: registering twice is a no-op.

Importing this module imports nothing from vLLM.
"""

from __future__ import annotations

from grpo_stream.engines.vllm.compat import BACKEND
from grpo_stream.logs import setup_child_logging


def register() -> None:
    """Register `vllm.worker.HandoffTransfer` as the backend named BACKEND; in a process vLLM
    spawned from a generator, log as the generator does (`grpo_stream.logs`: JSON, its level,
    vLLM's own records below warning kept off `up`'s console)."""
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory

    setup_child_logging()

    try:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "grpo_stream.engines.vllm.worker", "HandoffTransfer"
        )
    except ValueError:  # registered already (vLLM loaded its plugins again)
        return
