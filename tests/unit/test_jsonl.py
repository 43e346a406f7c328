"""Reading JSON-lines files that are being written: rows are whole JSON objects, each read
once by a tail, a rewritten file from its top, a missing file as nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_stream import jsonl
from grpo_stream.jsonl import JsonlTail, last_row, read_rows


def test_a_missing_file_reads_as_nothing_until_it_appears(tmp_path: Path) -> None:
    tail = JsonlTail(tmp_path / "m.jsonl")
    assert tail.read() == []
    (tmp_path / "m.jsonl").write_text('{"step": 1}\n')
    assert tail.read() == [{"step": 1}]


def test_a_partial_last_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": ')
    tail = JsonlTail(path)
    assert tail.read() == [{"step": 1}]
    assert tail.read() == []
    with path.open("a") as fh:
        fh.write('2}\n{"step": 3}\n')
    assert tail.read() == [{"step": 2}, {"step": 3}]


def test_lines_that_are_not_json_objects_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'not json\n[1, 2]\n7\n\xff\xfe{"x": 1}\n{"step": 4}\n\n')
    assert JsonlTail(path).read() == [{"step": 4}]
    assert read_rows(path) == [{"step": 4}]


def test_a_file_rewritten_shorter_is_read_again_from_its_top(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)))
    tail = JsonlTail(path)
    assert len(tail.read()) == 5
    path.write_text('{"step": 1}\n')
    assert tail.read() == [{"step": 1}]


def test_a_line_longer_than_one_read_does_not_stop_the_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl, "MAX_READ_BYTES", 64)
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"text": "x" * 200}) + "\n" + '{"step": 9}\n')
    tail = JsonlTail(path)
    rows = [row for _ in range(10) for row in tail.read()]
    assert {"step": 9} in rows


def test_read_rows_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_rows(tmp_path / "none.jsonl") == []


def test_read_rows_leaves_out_a_last_line_being_written(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "reward": 0.')
    assert read_rows(path) == [{"step": 1}]


def test_read_rows_keeps_a_whole_last_line_without_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}')
    assert read_rows(path) == [{"step": 1}, {"step": 2}]


def test_last_row_is_the_last_whole_object(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n[3]\n{"step": 4, "lo')
    assert last_row(path) == {"step": 2}


def test_last_row_of_a_file_longer_than_its_window(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    rows = [{"step": s, "pad": "x" * 100} for s in range(2000)]  # ~230 kB: past the window
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert path.stat().st_size > 2 * jsonl.LAST_ROW_WINDOW
    assert last_row(path) == rows[-1]


def test_last_row_of_a_missing_file_or_one_without_rows_is_none(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    assert last_row(tmp_path / "none.jsonl") is None
    assert last_row(tmp_path / "empty.jsonl") is None
