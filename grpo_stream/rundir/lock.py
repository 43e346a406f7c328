"""One run per run directory: an exclusive flock on RUN_DIR/.lock.

`up` takes the lock before it starts anything and holds it until it exits; a hub started on
its own (`grpo-stream run grouper`) takes it too. The kernel releases a flock when its holder
dies, even by SIGKILL, so `--resume` after a crash needs no cleanup: the file stays, the lock
does not. The file records the holder (pid, host, command) for the one-line refusal.

The hub that `up` starts inherits `OWNER_ENV` (the pid and host of `up`): it finds the lock held by
that very `up` and runs under it instead of refusing.
"""

from __future__ import annotations

import fcntl
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import IO

LOCK_FILE = ".lock"
OWNER_ENV = "GRPO_STREAM_RUN_LOCK_OWNER"
"""pid and host of the process that holds the run directory's lock for this process."""


class RunLocked(RuntimeError):
    """Another live process holds the run directory; the message names it."""


@dataclass
class RunLock:
    """The held lock; keep it referenced for as long as the run lasts."""

    path: Path
    handle: IO[str]
    owner: str  # "pid N on host H"

    def release(self) -> None:
        self.handle.close()  # closing the descriptor releases the flock


def holder_of(path: Path) -> str:
    """What the lock file says about its holder (best effort: it may be mid-write)."""
    try:
        return path.read_text().strip() or "an unknown process"
    except OSError:
        return "an unknown process"


def acquire(run_dir: Path, command: str = "up") -> RunLock | None:
    """Take RUN_DIR's lock, creating the directory. Raises RunLocked if another process has
    it; returns None when the holder is the `up` this process was started by (OWNER_ENV)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    handle = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        holder = holder_of(path)
        inherited = os.environ.get(OWNER_ENV)
        if inherited and holder.startswith(f"{inherited} "):
            return None
        raise RunLocked(
            f"{run_dir} is in use by {holder}: stop that run first, or give this one "
            "another run directory (--run-dir, run.run_dir)"
        ) from None
    owner = f"pid {os.getpid()} on host {socket.gethostname()}"
    handle.seek(0)
    handle.truncate()
    handle.write(f"{owner} (grpo-stream {command})\n")
    handle.flush()
    return RunLock(path, handle, owner)


def is_held(run_dir: Path) -> bool:
    """Whether a live process holds RUN_DIR's lock now (probe: take it and let go)."""
    path = run_dir / LOCK_FILE
    if not path.exists():
        return False
    with path.open("a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return False


def export_owner(lock: RunLock) -> None:
    """Let the services this process starts run under its lock (see the module doc)."""
    os.environ[OWNER_ENV] = lock.owner
