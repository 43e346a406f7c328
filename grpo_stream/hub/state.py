"""Atomic hub checkpoints: ledger, replay buffer, counters in one msgpack file.

Written to a temporary file, fsynced, then renamed over the previous one, so a crash
while writing leaves the previous checkpoint intact. Never pickle.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgpack


def save_state(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(msgpack.packb(state, use_bin_type=True))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_state(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    data = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    if not isinstance(data, dict):
        raise ValueError(f"hub checkpoint {path} is not a map")
    return data
