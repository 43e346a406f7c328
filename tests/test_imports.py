"""The import graph stays a floor plan (docs/architecture.md, "The floor plan"): settings on
the ground floor, no cycles, and an import inside a function only where it keeps a heavy
dependency out of start-up. The graph is read from the source (tests/importgraph.py); the
floors are in docs/architecture.md and held to it by test_architecture.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from importgraph import GRAPH, MODULES, ROOT, cycles

HEAVY = frozenset(
    {"torch", "transformers", "vllm", "peft", "matplotlib", "datasets", "math_verify",
     "verifiers", "reasoning_gym", "ray", "tensorboard", "wandb", "starlette", "uvicorn",
     "huggingface_hub", "tokenizers", "safetensors", "pyarrow", "openai", "httpx", "ml_dtypes"}
)  # fmt: skip
"""Third-party packages slow enough to import (or optional enough) that a module may
import them, or a module of ours that needs them, inside the function that uses them."""
LATE = {
    ("grpo_stream.hardware.nvml", "pynvml"): "the NVML boundary: resolved at each read so a "
    "recorded or fake NVML can stand in for the hardware (sys.modules)",
    ("grpo_stream.algo.regularizer", "torch"): "torch.distributed.tensor exists only where "
    "torch.distributed.is_available()",
}
"""Function-level imports kept for another reason than a heavy dependency, each with it."""


def heavy_loaded(module: str, seen: set[str] | None = None) -> frozenset[str]:
    """The HEAVY packages that importing `module` imports (following module-level imports)."""
    seen = set() if seen is None else seen
    if module in seen:
        return frozenset()
    seen.add(module)
    out: set[str] = set()
    for edge in GRAPH[module]:
        if edge.level != "module":
            continue
        if edge.target in HEAVY:
            out.add(edge.target)
        elif edge.target in MODULES:
            out |= heavy_loaded(edge.target, seen)
    return frozenset(out)


def test_the_graph_covers_the_package() -> None:
    assert "grpo_stream.config.run" in MODULES and "grpo_stream.services.trainer" in MODULES
    assert any(e.target == "grpo_stream.config.run" for e in GRAPH["grpo_stream.config"])


def test_no_import_cycles() -> None:
    assert cycles() == []


def test_settings_import_no_role() -> None:
    upward = [
        f"{m} -> {e.target} (line {e.line})"
        for m in MODULES
        if m.startswith("grpo_stream.config")
        for e in GRAPH[m]
        if e.target.startswith("grpo_stream") and not e.target.startswith("grpo_stream.config")
    ]
    assert upward == []


def test_function_level_imports_keep_a_heavy_dependency_out_of_start_up() -> None:
    """An import inside a function is for a module that loads a heavy package the importing
    module does not load already; any other belongs at the top of the file."""
    pointless = []
    for module in MODULES:
        if module.startswith("grpo_stream.cli"):
            continue  # each command imports its implementation when run (`--help` is instant)
        here = heavy_loaded(module)
        for edge in GRAPH[module]:
            if edge.level != "function":
                continue
            there = {edge.target} & HEAVY or (
                heavy_loaded(edge.target) if edge.target in MODULES else set()
            )
            if not there - here and (module, edge.target) not in LATE:
                pointless.append(f"{MODULES[module].relative_to(ROOT)}:{edge.line} {edge.target}")
    assert pointless == []
