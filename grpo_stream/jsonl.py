"""Reading JSON-lines files while their writers may still be writing them: the run
directory's metrics.jsonl, eval.jsonl, completions.jsonl and the services' logs/*.jsonl.

Every reader keeps the same rules:
- a row is a line that parses as a JSON object; any other line (not JSON, not valid UTF-8,
  an array or a number, blank) is skipped;
- a line a writer is still writing never reads as a row: a proper prefix of a JSON object
  is never one, so `read_rows` and `last_row` may parse every line they see, and `JsonlTail`,
  which must not move past it, leaves a last line without its newline for its next read;
- a missing file (or a folder in its place) reads as no rows.

This module imports nothing of the project: it sits below the ground floor's readers
(`grpo_stream.logs`, `grpo_stream.rundir`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MAX_READ_BYTES = 8 << 20
"""Most bytes one `JsonlTail.read` takes in (the rest waits for the next read): a page opened
on a long run catches up over a few polls instead of one long stall."""
LAST_ROW_WINDOW = 1 << 16
"""Bytes from the end of a file `last_row` looks through (a row is far shorter)."""


def rows_of(lines: Iterable[bytes]) -> list[dict[str, Any]]:
    """The lines that parse as JSON objects, in order."""
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:  # not JSON (JSONDecodeError), or not UTF-8 (UnicodeDecodeError)
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every row of the file at `path`, in file order ([] when there is no file)."""
    try:
        data = Path(path).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return []
    return rows_of(data.splitlines())


def last_row(path: Path) -> dict[str, Any] | None:
    """The file's last row (None: no file, or no row in its last `LAST_ROW_WINDOW` bytes),
    read from its end without reading the rest."""
    try:
        with Path(path).open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - LAST_ROW_WINDOW))
            lines = fh.read().splitlines()
    except (FileNotFoundError, IsADirectoryError):
        return None
    for line in reversed(lines):  # the window's cut first line does not parse: skipped
        found = rows_of([line])
        if found:
            return found[0]
    return None


class JsonlTail:
    """One file followed from its start: each `read` returns the rows of the whole lines
    added since the last. A file that shrank (rewritten, say by a resumed run) is read again
    from its top; a line longer than `MAX_READ_BYTES` is skipped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        """The rows added since the last read."""
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
        return rows_of(data[:end].splitlines())
