"""The context-parallel tests' two gloo ranks: spawned once per session, their results read
by the tests of this directory (context_ranks.py is the worker)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def group_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Each rank's results (rank 0 first) of context_ranks.run on two gloo ranks."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("context")
    sys.path.insert(0, str(HERE))  # spawn children inherit sys.path
    try:
        import context_ranks

        mp.spawn(context_ranks.run, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    finally:
        sys.path.remove(str(HERE))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
