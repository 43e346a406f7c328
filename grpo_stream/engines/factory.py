"""`make_engine`: the engine a generator runs, by name. Importing an engine's module loads
neither torch nor vLLM (each imports them where it needs them)."""

from __future__ import annotations

import importlib.util
from typing import Literal

from grpo_stream.config import GeneratorSettings, ModelSettings
from grpo_stream.config.lora import LoraSettings
from grpo_stream.config.transport import SecuritySettings, TransportSettings, WeightsSettings
from grpo_stream.engines.base import Engine, EngineUnavailableError
from grpo_stream.engines.hf import HFEngine
from grpo_stream.engines.vllm.engine import VLLMEngine


def vllm_available() -> bool:
    """Whether the vllm package can be imported (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def make_engine(
    name: Literal["hf", "vllm"],
    model: ModelSettings,
    generator: GeneratorSettings,
    transport: TransportSettings,
    security: SecuritySettings,
    device: str | None = None,
    lora: LoraSettings | None = None,
    weights: WeightsSettings | None = None,
    secret: bytes | None = None,
) -> Engine:
    """Build the engine a generator runs: `hf` (transformers) or `vllm`.

    `device` is "cpu", "cuda" or "cuda:N" (default: a GPU when one is visible). vLLM picks
    its GPU itself: select it with CUDA_VISIBLE_DEVICES. `lora` (the trainer's
    `trainer.lora`): vLLM must enable LoRA at start; hf recognises adapter versions itself.
    `weights`: how versions are fetched (deltas; hf relays them when `weights.relay`).
    `secret`: the run's, which signs the engine's relay claim (only holders of the secret
    become relays).
    """
    if name == "hf":
        return HFEngine.from_settings(model, transport, security, device, weights, secret)
    if name == "vllm":
        if not vllm_available():
            raise EngineUnavailableError(
                "generator.engine = 'vllm' needs vLLM, which is not installed: "
                "pip install 'grpo-stream[vllm]', or set generator.engine = 'hf'"
            )

        return VLLMEngine.from_settings(
            model,
            generator,
            transport,
            security,
            device,
            lora=lora,
            weights=weights,
            secret=secret,
        )
    raise ValueError(f"unknown engine {name!r}: expected 'hf' or 'vllm'")
