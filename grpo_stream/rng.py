"""The process's random number generators (torch, Python, NumPy, and the current CUDA
device's): their state captured and restored, for checkpoints and rollbacks.

The CUDA state is the current device's (a trainer rank's own GPU: `TrainState.create` sets
it before anything is restored), captured only where CUDA is already initialised, so a CPU
process on a GPU host never starts CUDA for it; a state saved on a GPU and restored where
CUDA is unavailable restores the rest and leaves CUDA alone.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """RNG states as tensors and plain lists, so torch.load(weights_only=True) can read them."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [
            np_name,
            torch.from_numpy(np.asarray(np_keys).astype(np.int64)),
            np_pos,
            np_has_gauss,
            np_gauss,
        ],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(py_state), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
