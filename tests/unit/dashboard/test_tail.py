"""Following a JSON-lines file: whole lines only, each once; a rewritten file from its top."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_stream.dashboard.tail import JsonlTail


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
    path.write_text('not json\n[1, 2]\n{"step": 4}\n\n')
    assert JsonlTail(path).read() == [{"step": 4}]


def test_a_file_rewritten_shorter_is_read_again_from_its_top(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)))
    tail = JsonlTail(path)
    assert len(tail.read()) == 5
    path.write_text('{"step": 1}\n')
    assert tail.read() == [{"step": 1}]


def test_a_line_longer_than_one_read_does_not_stop_the_tail(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("grpo_stream.dashboard.tail.MAX_READ_BYTES", 64)
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"text": "x" * 200}) + "\n" + '{"step": 9}\n')
    tail = JsonlTail(path)
    rows = [row for _ in range(10) for row in tail.read()]
    assert {"step": 9} in rows
