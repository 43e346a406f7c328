"""The import graph stays a floor plan (STYLE.md): settings on the ground floor, no cycles,
and an import inside a function only where it keeps a heavy dependency out of start-up.

Read from the source with `ast` (nothing is imported): every `import` counts, at module
level, under `if TYPE_CHECKING:` and inside functions alike, so a cycle cannot hide in a
function body or a type annotation.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"grpo_stream": ROOT / "grpo_stream", "grpo_stream.services": ROOT / "services",
            "grpo_stream.protocols": ROOT / "protocols"}  # fmt: skip
HEAVY = frozenset(
    {"torch", "transformers", "vllm", "peft", "matplotlib", "datasets", "math_verify",
     "verifiers", "reasoning_gym", "ray", "tensorboard", "wandb", "starlette", "uvicorn",
     "huggingface_hub", "tokenizers", "safetensors", "pyarrow", "openai", "httpx"}
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


@dataclass(frozen=True)
class Import:
    target: str  # the module imported (an internal module, or a top-level third-party name)
    line: int
    level: str  # "module", "typing" (under TYPE_CHECKING) or "function"


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for prefix, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str:
    """The internal module an imported name lives in (`a.b.c` -> `a.b` when c is a name)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, level: str) -> Iterator[tuple[ast.AST, str]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk(child, "function")
        elif isinstance(child, ast.If) and _is_type_checking(child) and level == "module":
            yield from _walk(child, "typing")
        else:
            yield child, level
            yield from _walk(child, level)


def imports_of(module: str) -> list[Import]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[Import] = []
    for node, level in _walk(ast.parse(path.read_text()), "module"):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            names = [f"{base}.{a.name}" for a in node.names] if base else []
        for name in names:
            internal = name.startswith("grpo_stream")
            target = _resolve(name) if internal else name.split(".")[0]
            if target and target != module:
                out.append(Import(target, node.lineno, level))  # type: ignore[attr-defined]
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for edge in GRAPH[v]:
            w = edge.target
            if w not in MODULES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return found


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
    assert _cycles() == []


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
