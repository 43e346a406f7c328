"""Long waits report progress while they last, and stay quiet when they are short."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from grpo_stream.progress import long_wait


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


def test_a_long_wait_reports_progress_then_done() -> None:
    with capture_logs() as logs, long_wait("thing.load", every_s=0.05, unit="chunks", k=1) as w:
        w.total = 4
        for done in range(1, 5):
            time.sleep(0.08)
            w.done = done
    progress = _events(logs, "thing.load.progress")
    assert len(progress) >= 3
    assert all(e["k"] == 1 and e["log_level"] == "info" for e in progress)
    assert [e["seconds"] for e in progress] == sorted(e["seconds"] for e in progress)
    assert progress[-1]["total"] == 4 and progress[-1]["unit"] == "chunks"
    assert 0 < progress[-1]["percent"] <= 100
    (done,) = _events(logs, "thing.load.done")
    assert done["log_level"] == "info" and done["done"] == 4 and done["percent"] == 100.0
    assert done["seconds"] >= 0.3


def test_a_short_wait_logs_only_at_debug() -> None:
    with capture_logs() as logs, long_wait("thing.load", every_s=5.0):
        pass
    assert not _events(logs, "thing.load.progress")
    assert [e["log_level"] for e in _events(logs, "thing.load.done")] == ["debug"]


def test_a_failing_wait_says_so_and_raises() -> None:
    failing = pytest.raises(OSError, match="disk full")
    with capture_logs() as logs, failing, long_wait("thing.write", every_s=0.02):
        time.sleep(0.1)
        raise OSError("disk full")
    (failed,) = _events(logs, "thing.write.failed")
    assert failed["log_level"] == "warning" and "disk full" in failed["error"]
    assert not _events(logs, "thing.write.done")


def test_progress_lines_carry_the_callers_bound_fields() -> None:
    structlog.contextvars.bind_contextvars(service="trainer")
    try:
        merge = [structlog.contextvars.merge_contextvars]
        with capture_logs(processors=merge) as logs, long_wait("thing.load", every_s=0.02):
            time.sleep(0.1)
    finally:
        structlog.contextvars.unbind_contextvars("service")
    assert _events(logs, "thing.load.progress")[0]["service"] == "trainer"


def test_checkpoint_write_is_a_long_wait_through_its_stages(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from grpo_stream.models.loading import resolve_model
    from grpo_stream.training.checkpoint import save_checkpoint

    model = AutoModelForCausalLM.from_pretrained(resolve_model("grpo-stream/tiny-arith"))
    with capture_logs() as logs:
        save_checkpoint(tmp_path, 1, model, None, {"step": 1}, keep=2)
    (done,) = _events(logs, "checkpoint.write.done")  # debug: the tiny model writes fast
    assert done["step"] == 1 and done["stage"] == "fsync"
