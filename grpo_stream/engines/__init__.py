"""Inference engines behind one interface: `hf` (transformers) and `vllm`.

Importing this package imports neither torch nor vLLM; `make_engine` loads the one asked for.
"""

from grpo_stream.engines.base import Engine, EngineUnavailableError
from grpo_stream.engines.factory import make_engine

__all__ = ["Engine", "EngineUnavailableError", "make_engine"]
