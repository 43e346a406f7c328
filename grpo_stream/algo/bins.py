"""First-fit-decreasing bins: which items share a row of a given width.

Used for sequences packed into rows (training/packing.py) and for prompt groups packed into
rows (algo/grouped.py). Invariants: every item is in exactly one row; a row's lengths sum to
at most `width` unless a single item is longer (then it is alone); at most `per_row` items
per row.
"""

from __future__ import annotations

from collections.abc import Sequence


def first_fit_rows(lengths: Sequence[int], width: int, per_row: int) -> list[list[int]]:
    """Rows of sequence indices, first-fit decreasing: longest first, each into the first
    row with room (fill <= width, at most per_row sequences)."""
    rows: list[list[int]] = []
    fills: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        n = lengths[i]
        for r, fill in enumerate(fills):
            if fill + n <= width and len(rows[r]) < per_row:
                rows[r].append(i)
                fills[r] += n
                break
        else:
            rows.append([i])
            fills.append(n)
    return rows
