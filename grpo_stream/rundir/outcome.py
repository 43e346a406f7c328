"""How a run ended, in RUN_DIR/outcome.json, so that `status` can tell it after the fact.

`up` writes it when it stops: `completed` (max_steps reached), `interrupted` (Ctrl-C or
SIGTERM: resumable), `failed` (a service died; `reason` says which and why, including a hub
stopped by `run.stall_abort_s`). A run whose `up` was killed writes nothing: `status` then
finds the run directory unlocked and no outcome, and calls it dead.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

OUTCOME_FILE = "outcome.json"
Ended = Literal["completed", "interrupted", "failed"]
ENDINGS = ("completed", "interrupted", "failed")


@dataclass(frozen=True)
class Outcome:
    """The end of one `up`."""

    ended: Ended
    steps: int
    reason: str
    wall_time: float


def write_outcome(run_dir: Path, ended: Ended, steps: int, reason: str = "") -> Outcome:
    """Record the end (atomically: a reader never sees half a file)."""
    outcome = Outcome(ended, steps, reason, round(time.time(), 3))
    path = run_dir / OUTCOME_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(outcome)) + "\n")
    os.replace(tmp, path)
    return outcome


def read_outcome(run_dir: Path) -> Outcome | None:
    """The recorded end, or None when none was written (a running or killed run)."""
    path = run_dir / OUTCOME_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("ended") not in ENDINGS:
        return None
    return Outcome(data["ended"], int(data["steps"]), str(data["reason"]), float(data["wall_time"]))


def clear_outcome(run_dir: Path) -> None:
    """A run (re)starting has no outcome yet."""
    (run_dir / OUTCOME_FILE).unlink(missing_ok=True)
