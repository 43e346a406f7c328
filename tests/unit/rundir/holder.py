"""A run directory whose lock another process holds, as while `up` runs there."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOLD = (
    "import sys, time; from pathlib import Path; from grpo_stream.rundir.lock import "
    "acquire; lock = acquire(Path(sys.argv[1])); print('held', flush=True); time.sleep(30)"
)


@contextmanager
def held_elsewhere(run_dir: Path) -> Iterator[None]:
    """`run_dir`'s lock held by a child process for the block (at most 30 s)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()
