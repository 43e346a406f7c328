"""RUN_DIR/report.png: drawn from metrics.jsonl (with eval.jsonl's held-out rows), by a child
process light enough to start twice in every run (the trainer's first step and its end)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from grpo_stream.report import main
from grpo_stream.rundir.evals import EVAL_FILE

PNG = b"\x89PNG\r\n\x1a\n"


def _write_rows(path: Path, rows: list[dict[str, float]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_report_is_drawn_from_the_metrics_and_the_held_out_evaluations(tmp_path: Path) -> None:
    steps = [{"step": s, "reward_mean": s / 10, "kl": 0.01 * s, "tau": 1.0} for s in range(1, 6)]
    _write_rows(tmp_path / "metrics.jsonl", steps)
    _write_rows(tmp_path / EVAL_FILE, [{"step": 0, "eval/pass@1": 0.2, "eval/k": 4}])
    assert main([str(tmp_path)]) == 0
    assert (tmp_path / "report.png").read_bytes().startswith(PNG)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "eval.jsonl",
        "metrics.jsonl",
        "report.png",
    ]


def test_a_run_without_metrics_gets_no_report(tmp_path: Path) -> None:
    assert main([str(tmp_path)]) == 0
    assert not (tmp_path / "report.png").exists()


def test_the_reports_process_loads_neither_the_wire_protocol_nor_the_settings() -> None:
    """The evaluator (agents, rewards, tasks, settings) and the wire protocol (ml_dtypes'
    ~1 s of CPU) cost the child more than the drawing did: it reads two JSONL files."""
    heavy = ["grpo_stream.protocols", "grpo_stream.config", "ml_dtypes", "pydantic", "torch"]
    code = f"import sys, grpo_stream.report; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
