"""A strict gloo for CPU tests: collectives that refuse a tensor off the trainer's device.

On a GPU host the trainer's tensors live on cuda:N and NCCL takes only those. A tensor that
our code makes without naming a device lands on the host's default device, the CPU, and the
first collective given it fails (NCCL: "No backend type associated with device type cpu").
On a CPU test host the default device and the trainer's are the same, so gloo takes such a
tensor and nothing notices. Two pieces make the mistake visible here; the CUDA boundary is
what they replace (the host's default device is not the trainer's), not our code:

- `HostDefaultElsewhere`: while active, a tensor factory (torch.tensor, zeros, arange, ...)
  called WITHOUT a device from a module of grpo_stream.training or grpo_stream.algo (or
  grpo_stream.collectives) that uses torch.distributed makes its tensor on `meta`: a device
  that is not the trainer's, as the CPU is not the trainer's on a GPU host. Other modules
  keep the CPU: they build host tensors by design (batches made on the CPU, then moved to
  the trainer's device).
- `strict_collectives(device)`: torch.distributed's tensor collectives check that every
  tensor they are given is on `device` (the trainer's resolved device) before gloo sees it,
  and raise CollectiveDeviceError naming the collective, the tensor's device, the expected
  one and the caller. Each checked call is counted by the caller's function name, so a test
  can show the sites it meant to exercise were reached.

Collectives called through the module attribute (`torch.distributed.all_reduce`, or
`dist.all_reduce` with `dist = torch.distributed`) are checked; that is how grpo_stream
calls them. FSDP2's own collectives go through it too and pass (its buffers are on the
parameters' device).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import pkgutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

ELSEWHERE = torch.device("meta")
FACTORIES = frozenset(
    {
        torch.tensor,
        torch.as_tensor,
        torch.scalar_tensor,
        torch.zeros,
        torch.ones,
        torch.empty,
        torch.full,
        torch.arange,
        torch.linspace,
        torch.rand,
        torch.randn,
        torch.randint,
        torch.eye,
    }
)
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "gather",
    "scatter",
)
PACKAGES = (
    "grpo_stream",
    "grpo_stream.training",
    "grpo_stream.training.context",
    "grpo_stream.algo",
)
DIST = "torch.distributed"


class CollectiveDeviceError(RuntimeError):
    """A collective was given a tensor that is not on the trainer's device."""


def _uses_torch_distributed(path: Path) -> bool:
    """The module's code (not its docstrings) reaches torch.distributed."""
    for node in ast.walk(ast.parse(path.read_text())):
        torch_dot = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        if torch_dot and (node.value.id, node.attr) == ("torch", "distributed"):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(DIST):
            return True
        if isinstance(node, ast.Import) and any(a.name.startswith(DIST) for a in node.names):
            return True
    return False


def distributed_modules() -> frozenset[str]:
    """Modules of grpo_stream.training (context parallelism's included) and grpo_stream.algo,
    and grpo_stream's own top-level modules (grpo_stream.collectives), that use
    torch.distributed."""
    found = set()
    for package in PACKAGES:
        root = Path(importlib.import_module(package).__path__[0])
        for info in pkgutil.iter_modules([str(root)]):
            if not info.ispkg and _uses_torch_distributed(root / f"{info.name}.py"):
                found.add(f"{package}.{info.name}")
    return frozenset(found)


class HostDefaultElsewhere(TorchFunctionMode):
    """Device-less tensor factories called from `modules` make their tensors on `meta`."""

    def __init__(self, modules: frozenset[str] | None = None) -> None:
        super().__init__()
        self.modules = distributed_modules() if modules is None else modules
        self.redirected: Counter[str] = Counter()  # "module:line" of each redirected factory

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func in FACTORIES and kwargs.get("device") is None:
            caller = sys._getframe(1)
            module = caller.f_globals.get("__name__", "")
            if module in self.modules:
                kwargs["device"] = ELSEWHERE
                self.redirected[f"{module}:{caller.f_lineno}"] += 1
        return func(*args, **kwargs)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _checked(
    name: str, real: Callable[..., Any], device: torch.device, seen: Counter[str]
) -> Callable[..., Any]:
    @functools.wraps(real)
    def collective(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1)
        where = f"{caller.f_code.co_filename}:{caller.f_lineno} ({caller.f_code.co_name})"
        for tensor in _tensors([*args, *kwargs.values()]):
            if tensor.device != device:
                raise CollectiveDeviceError(
                    f"torch.distributed.{name} was given a tensor on {tensor.device}, not on "
                    f"the trainer's device {device}: {where}"
                )
        seen[caller.f_code.co_name] += 1
        return real(*args, **kwargs)

    return collective


@contextlib.contextmanager
def strict_collectives(device: str | torch.device) -> Iterator[Counter[str]]:
    """Check every tensor collective's tensors are on `device`; yields the counts of checked
    calls by calling function name."""
    expected = torch.device(device)
    dist = torch.distributed
    seen: Counter[str] = Counter()
    real = {name: getattr(dist, name) for name in COLLECTIVES}
    try:
        for name, fn in real.items():
            setattr(dist, name, _checked(name, fn, expected, seen))
        yield seen
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)
