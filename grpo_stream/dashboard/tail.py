"""Following a JSON-lines file: each read returns the objects of the whole lines added since
the last one.

Invariants: a partial last line (a writer mid-line) is left for the next read; a line that is
not a JSON object is skipped; a file that shrank (rewritten, say by a resumed run) is read
again from its start; a missing file reads as nothing; a line longer than `MAX_READ_BYTES` is
skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_READ_BYTES = 8 << 20
"""Most bytes one read takes in (the rest waits for the next read): a page opened on a long
run catches up over a few polls instead of one long stall."""


class JsonlTail:
    """One file, followed from its start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        """The objects added since the last read."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.offset:
            self.offset = 0  # rewritten: read again from the top
        if size == self.offset:
            return []
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read(min(size - self.offset, MAX_READ_BYTES))
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) == MAX_READ_BYTES:
            end = len(data)  # one line longer than a read: skip it (its pieces do not parse)
        self.offset += end
        rows = []
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows
