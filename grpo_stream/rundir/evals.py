"""RUN_DIR/eval.jsonl: one row per evaluation during training (the evaluator's `OnlineEval`
writes it), read without any service alive by the report, the tests and anyone else.

Light on purpose: the report's child process reads it, and importing the evaluator (agents,
rewards, tasks, the wire protocol) would cost that child more than drawing the page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_stream.jsonl import read_rows

EVAL_FILE = "eval.jsonl"
"""RUN_DIR/eval.jsonl: one line per evaluation, beside metrics.jsonl."""


def read_eval(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of RUN_DIR/eval.jsonl (none when the run did not evaluate), safe on a live
    run (`grpo_stream.jsonl`)."""
    return read_rows(Path(run_dir) / EVAL_FILE)
