"""The package's import graph, read from the source with `ast` (nothing is imported), for the
tests that hold it to its floor plan (test_imports.py, test_architecture.py).

Every `import` counts, at module level, under `if TYPE_CHECKING:` and inside functions
alike, so a cycle cannot hide in a function body or a type annotation. The packages and
the folders they are built from are read from pyproject.toml's `package-dir`, the mapping
the wheel is built with (`services/` and `protocols/` install as `grpo_stream.services` and
`grpo_stream.protocols`).
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _package_dirs() -> dict[str, Path]:
    """Each top-level package of the wheel and its folder, as pyproject.toml maps them."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in setuptools["package-dir"].items()}


PACKAGES = _package_dirs()


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


def cycles() -> list[list[str]]:
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
