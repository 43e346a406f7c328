"""Policy versions unique forever: the high-water mark of every version ever announced.

Invariants:
- the mark (RUN_DIR/trainer/version_mark) is on disk, fsynced, before a version is announced,
  so no crash can leave an announced version unrecorded;
- a resumed trainer continues at `resumed_version`: strictly above every version it ever
  announced, and more than `max_staleness` above it, so whatever the discarded timeline
  generated (versions after the checkpoint, up to the mark) is stale by construction under
  the hub's gate, and no version number ever names two different sets of weights.
"""

from __future__ import annotations

import os
from pathlib import Path


class VersionMark:
    """The highest version this run's trainer announced, persisted at publish time."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / "trainer" / "version_mark"

    def highest(self) -> int | None:
        """The mark, or None when nothing was ever announced."""
        if not self.path.exists():
            return None
        text = self.path.read_text().strip()
        if not text.isdigit():
            raise ValueError(f"{self.path}: not a version number: {text!r}")
        return int(text)

    def record(self, version: int) -> None:
        """Persist `version` (atomic: temp file, fsync, rename) before it is announced."""
        if (self.highest() or -1) >= version:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as fh:
            fh.write(f"{version}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


def resumed_version(checkpoint_version: int, mark: int | None, max_staleness: int) -> int:
    """The version a trainer resumed from a checkpoint publishes its weights as."""
    if mark is None or mark < checkpoint_version:
        return checkpoint_version  # nothing announced past the checkpoint
    if mark == checkpoint_version:
        return checkpoint_version  # the checkpoint is the newest version: nothing discarded
    return mark + max_staleness + 1
