"""make_engine: choosing an engine, and what importing the package costs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_stream.config import GeneratorSettings, ModelSettings
from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.engines import EngineUnavailableError, make_engine
from grpo_stream.engines.factory import vllm_available
from grpo_stream.sampling import Sampling


def settings() -> tuple[ModelSettings, GeneratorSettings, TransportSettings, SecuritySettings]:
    return ModelSettings(), GeneratorSettings(), TransportSettings(), SecuritySettings()


@pytest.mark.skipif(vllm_available(), reason="vLLM is installed here")
def test_make_engine_vllm_without_vllm_raises_a_clear_error() -> None:
    with pytest.raises(EngineUnavailableError, match=r"pip install 'grpo-stream\[vllm\]'"):
        make_engine("vllm", *settings(), device="cpu")


def test_make_engine_rejects_an_unknown_engine_name() -> None:
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        make_engine("tgi", *settings())  # type: ignore[arg-type]


def test_importing_engines_imports_neither_torch_nor_vllm() -> None:
    code = (
        "import sys, grpo_stream.engines, grpo_stream.engines.vllm.engine, "
        "grpo_stream.engines.vllm.plugin, grpo_stream.services.generator;"
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_make_engine_hf_loads_a_model_directory_in_float32_on_cpu(tiny_dir: Path) -> None:
    _, generator, transport, security = settings()
    model = ModelSettings(name_or_path=str(tiny_dir))
    engine = make_engine("hf", model, generator, transport, security, device="cpu")
    try:
        groups = engine.generate(["1+2="], group_size=2, sampling=Sampling(max_tokens=3, seed=0))
        assert engine.version == 0
        assert len(groups[0].completions) == 2
        assert next(engine.model.parameters()).dtype == torch.float32  # type: ignore[attr-defined]
    finally:
        engine.close()
