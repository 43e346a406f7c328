"""math: problems from a local JSONL or Parquet file, verified with math-verify.

Invariants: the file is read once, at construction; the stream visits every row once per
epoch in an order shuffled by (seed, epoch), so `problem(i)` is a pure function of the
settings and i and wraps around forever; the reference answer is a string (a GSM8K-style
`... #### 72` keeps only what follows the last `####`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from grpo_stream.tasks.base import Problem, chat_prompt
from grpo_stream.tasks.settings import RewardSpec


class TaskDataError(ValueError):
    """The math task's file is missing, unreadable or lacks a field."""


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a .jsonl/.json-lines or .parquet file."""
    if not path.is_file():
        raise TaskDataError(f"task.path: no such file: {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise TaskDataError(
                f"task.path {path} is Parquet, which needs pyarrow: pip install pyarrow"
            ) from exc
        rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
        return rows
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskDataError(f"{path}:{lineno}: not JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise TaskDataError(f"{path}:{lineno}: expected a JSON object per line")
            rows.append(row)
    return rows


def reference_answer(raw: Any) -> str:
    """The answer as a string; GSM8K's `reasoning #### 72` becomes `72`."""
    text = str(raw)
    return text.rsplit("####", 1)[1].strip() if "####" in text else text.strip()


@dataclass(frozen=True)
class MathTask:
    """A finite file of problems, reshuffled every epoch."""

    rows: tuple[tuple[str, str], ...]
    """(question, answer) pairs in file order."""
    seed: int = 0
    prompt_template: str = "{question}"
    tokenizer: Any = None
    chat_template: bool = False
    name: str = "math"
    size: int | None = field(init=False)

    def __post_init__(self) -> None:
        if not self.rows:
            raise TaskDataError("the math task's file has no rows")
        object.__setattr__(self, "size", len(self.rows))

    @classmethod
    def from_file(
        cls, path: Path, question_field: str, answer_field: str, **kwargs: Any
    ) -> MathTask:
        pairs = []
        for i, row in enumerate(read_rows(path)):
            for key in (question_field, answer_field):
                if key not in row:
                    raise TaskDataError(f"{path}: row {i} has no field {key!r} (task.*_field)")
            pairs.append((str(row[question_field]), reference_answer(row[answer_field])))
        return cls(rows=tuple(pairs), **kwargs)

    def problem(self, index: int) -> Problem:
        if index < 0:
            raise ValueError(f"problem index must be >= 0, got {index}")
        epoch, pos = divmod(index, len(self.rows))
        question, answer = self.rows[_order(self.seed, epoch, len(self.rows))[pos]]
        text = self.prompt_template.replace("{question}", question)
        prompt = chat_prompt(self.tokenizer, text) if self.chat_template else text
        return Problem(index=index, prompt=prompt, reference={"answer": answer})

    def default_rewards(self) -> list[RewardSpec]:
        return [RewardSpec(name="math_verify", weight=1.0)]


@lru_cache(maxsize=4)
def _order(seed: int, epoch: int, size: int) -> tuple[int, ...]:
    """The row order of one epoch: a permutation of range(size) fixed by (seed, epoch)."""
    order = list(range(size))
    random.Random(f"math:{seed}:{epoch}").shuffle(order)
    return tuple(order)
