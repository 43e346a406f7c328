"""A `pynvml` for subprocess tests: NVML replaced at its boundary by recorded devices.

Put this folder first on PYTHONPATH and name the recordings in GRPO_STREAM_TEST_NVML
("h100-sxm,h100-sxm"); every process of the run then sees those GPUs through NVML, as it
would on such a host. The error classes are the real pynvml's (loaded from the rest of
sys.path), so code that catches them behaves as with the real library.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

_here = str(Path(__file__).resolve().parent)
_spec = importlib.machinery.PathFinder.find_spec(
    "pynvml", [p for p in sys.path if p and str(Path(p).resolve()) != _here]
)
if _spec is None or _spec.loader is None:
    raise ImportError("the real pynvml is needed for its error classes")
_real = importlib.util.module_from_spec(_spec)
_me = sys.modules[__name__]
sys.modules[__name__] = _real  # the real module makes its error classes on sys.modules[name]
try:
    _spec.loader.exec_module(_real)
finally:
    sys.modules[__name__] = _me
for _name in dir(_real):
    if _name.startswith("NVMLError"):
        globals()[_name] = getattr(_real, _name)
_instance: Any = None


def _nvml() -> Any:
    global _instance
    if _instance is None:
        from grpo_stream.hardware.recorded import RecordedNvml, load_record

        names = [n for n in os.environ.get("GRPO_STREAM_TEST_NVML", "").split(",") if n]
        _instance = RecordedNvml([load_record(n) for n in names])
    return _instance


def __getattr__(name: str) -> Any:
    if name.startswith(("nvml", "NVML_")):
        return getattr(_nvml(), name)
    raise AttributeError(name)
