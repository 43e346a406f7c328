"""dataset: problems from a Hugging Face dataset or a local file, read with `datasets`.

Invariants: rows are read with the `datasets` library (memory-mapped Arrow; `streaming` for
sets larger than the disk cache); a map-style set is visited once per epoch in an order
shuffled by (seed, epoch), a streamed one in file order, so `problem(i)` is a pure function of
the settings and i and wraps around forever; every column a setting names is checked against
the set's columns when the task is built, so a typo fails before the run starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from grpo_stream.config.tasks import RewardSpec, TaskSettings
from grpo_stream.tasks.base import Problem, chat_prompt

BUILDERS = {
    ".parquet": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".arrow": "arrow",
}
"""The `datasets` builder that reads a local file, by suffix."""
_FIELD = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""A `{column}` reference, or an escaped brace `{{` / `}}` (written as one brace)."""


class TaskDataError(ValueError):
    """The task's data is missing, unreadable, empty, or lacks a field a setting names."""


def template_fields(template: str) -> list[str]:
    """The `{column}` names a prompt template references, in order."""
    return [name for name in _FIELD.findall(template) if name]


def fill_template(template: str, row: dict[str, Any]) -> str:
    """`template` with each `{column}` replaced by str(row[column]) and `{{`, `}}` by one
    brace; other braces (`\\boxed{}`) stay as they are."""

    def fill(found: re.Match[str]) -> str:
        name = found.group(1)
        if name is None:
            return found.group(0)[0]
        return str(row[name]) if name in row else found.group(0)

    return _FIELD.sub(fill, template)


def render_prompt(text: str, settings: TaskSettings, tokenizer: Any) -> str:
    """The prompt text as is, or wrapped in the chat template (with the system turn)."""
    if not settings.chat_template:
        return text
    if settings.system_prompt is None:
        return chat_prompt(tokenizer, text)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return chat_prompt(tokenizer, text)  # raises the same one-line error
    messages = [
        {"role": "system", "content": settings.system_prompt},
        {"role": "user", "content": text},
    ]
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def _is_local(source: str) -> bool:
    return (
        Path(source).expanduser().exists()
        or source.startswith((".", "/", "~"))
        or (Path(source).suffix in BUILDERS)
    )


def _saved_to_disk(path: Path) -> bool:
    return path.is_dir() and any(
        (path / name).exists() for name in ("dataset_dict.json", "state.json")
    )


def load_split(settings: TaskSettings) -> Any:
    """The rows of task.dataset / task.split: a `datasets.Dataset` (or IterableDataset)."""
    import datasets

    datasets.disable_progress_bars()  # services log JSON lines; a bar would garble them
    source, split = _source(settings), settings.split
    name = "task.dataset" if settings.dataset is not None else "task.path"  # the one set
    path = Path(source).expanduser()
    if _is_local(source) and not path.exists():
        raise TaskDataError(f"{name}: no such file or directory: {source}")
    try:
        if _saved_to_disk(path):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                return _pick_split(loaded, source, split)
            return _pick_split({"train": loaded}, source, split)
        if path.is_file():
            builder = BUILDERS.get(path.suffix)
            if builder is None:
                kinds = ", ".join(BUILDERS)
                raise TaskDataError(f"{name} {source}: cannot read {path.suffix!r} ({kinds})")
            if split != "train":
                raise TaskDataError(
                    f"task.split {split!r}: a single file ({source}) is the split 'train'"
                )
            if _empty_file(path):
                raise TaskDataError(f"{name} {source} (split {split}) has no rows")
            return datasets.load_dataset(
                builder, data_files=str(path), split="train", streaming=settings.streaming
            )
        return datasets.load_dataset(
            source, settings.subset, split=split, streaming=settings.streaming
        )
    except TaskDataError:
        raise
    except ValueError as exc:
        if "split" in str(exc).lower():
            raise TaskDataError(f"task.split {split!r}: not a split of {source} ({exc})") from None
        raise TaskDataError(f"{name} {source}: {_first_line(exc)}") from None
    except Exception as exc:  # datasets raises many kinds (FileNotFound, DatasetNotFound, ...)
        raise TaskDataError(f"{name} {source}: {_first_line(exc)}") from None


def _empty_file(path: Path) -> bool:
    """No rows, told cheaply (datasets itself fails on an empty Parquet file)."""
    if path.stat().st_size == 0:
        return True
    if path.suffix != ".parquet":
        return False
    import pyarrow.parquet as pq

    try:
        return bool(pq.read_metadata(path).num_rows == 0)
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise TaskDataError(f"task.dataset {path}: not a Parquet file ({exc})") from None


def _source(settings: TaskSettings) -> str:
    if settings.dataset is not None:
        return settings.dataset
    if settings.path is not None:
        return str(settings.path)
    raise TaskDataError(f"task.name = {settings.name!r} needs task.dataset (a name or a path)")


def _pick_split(splits: Any, source: str, split: str) -> Any:
    if split not in splits:
        raise TaskDataError(
            f"task.split {split!r}: not a split of {source}; splits: {', '.join(splits)}"
        )
    return splits[split]


def _first_line(exc: BaseException) -> str:
    while exc.__cause__ is not None:  # datasets wraps the reader's error: show the reader's
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def check_columns(settings: TaskSettings, columns: list[str], where: str) -> None:
    """Every column the settings name exists: the one-line error names the setting and lists
    the columns."""
    wanted = [("task.answer_field", settings.answer_field)]
    if settings.prompt_template is None:
        wanted.append(("task.prompt_field", settings.prompt_field))
    else:
        wanted += [("task.prompt_template", f) for f in template_fields(settings.prompt_template)]
    if settings.family_field is not None:
        wanted.append(("task.family_field", settings.family_field))
    for setting, name in wanted:
        if name not in columns:
            raise TaskDataError(
                f"{setting}: {where} has no column {name!r}; columns: {', '.join(columns)}"
            )


@dataclass
class DatasetTask:
    """Rows of one split of a dataset, reshuffled every epoch (map-style) or streamed."""

    settings: TaskSettings
    rows: Any
    """A datasets.Dataset (map-style) or datasets.IterableDataset (streaming)."""
    tokenizer: Any = None
    answer_regex: str | None = None
    name: str = "dataset"
    size: int | None = field(init=False)
    columns: list[str] = field(init=False)
    _stream: Any = field(init=False, default=None)
    _stream_pos: int = field(init=False, default=0)
    _stream_size: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        where = f"{_source(self.settings)} (split {self.settings.split})"
        self.columns = list(self.rows.column_names or [])
        if self.settings.streaming:
            first = next(iter(self.rows), None)
            if first is None:
                raise TaskDataError(f"task.dataset {where} has no rows")
            self.columns = self.columns or list(first)
            self.size = None
        else:
            self.size = len(self.rows)
            if not self.size:
                raise TaskDataError(f"task.dataset {where} has no rows")
        check_columns(self.settings, self.columns, where)

    @classmethod
    def from_settings(
        cls, settings: TaskSettings, tokenizer: Any = None, answer_regex: str | None = None
    ) -> DatasetTask:
        regex = answer_regex if settings.answer_regex is None else settings.answer_regex
        return cls(settings, load_split(settings), tokenizer, regex, settings.name)

    def row(self, index: int) -> dict[str, Any]:
        """The row problem `index` shows."""
        if index < 0:
            raise ValueError(f"problem index must be >= 0, got {index}")
        if self.size is None:
            return self._streamed(index)
        epoch, pos = divmod(index, self.size)
        row: dict[str, Any] = self.rows[int(epoch_order(self.settings.seed, epoch, self.size)[pos])]
        return row

    def problem(self, index: int) -> Problem:
        row = self.row(index)
        s = self.settings
        text = (
            str(row[s.prompt_field])
            if s.prompt_template is None
            else fill_template(s.prompt_template, row)
        )
        prompt = render_prompt(text, s, self.tokenizer)
        family = None if s.family_field is None else str(row[s.family_field])
        reference = {"answer": self._answer(row, index)}
        return Problem(index=index, prompt=prompt, reference=reference, family=family)

    def _answer(self, row: dict[str, Any], index: int) -> str:
        text = str(row[self.settings.answer_field])
        if self.answer_regex is None:
            return text.strip()
        found = re.search(self.answer_regex, text)
        if found is None:
            raise TaskDataError(
                f"task.answer_regex {self.answer_regex!r} does not match the answer of "
                f"problem {index}: {text[:80]!r}"
            )
        return (found.group(1) if found.groups() else found.group(0)).strip()

    def _streamed(self, index: int) -> dict[str, Any]:
        """Row `index` of the stream in file order (wrapping once its length is known)."""
        if self._stream_size is not None:
            index %= self._stream_size
        if self._stream is None or index < self._stream_pos:
            self._stream, self._stream_pos = iter(self.rows), 0
        while True:
            row = next(self._stream, None)
            if row is None:  # one epoch read: its length is the size
                self._stream_size = self._stream_pos
                self._stream = None
                return self._streamed(index)
            self._stream_pos += 1
            if self._stream_pos - 1 == index:
                return dict(row)

    def default_rewards(self) -> list[RewardSpec]:
        return [RewardSpec(name="math_verify", weight=1.0)]


@lru_cache(maxsize=4)
def epoch_order(seed: int, epoch: int, size: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The row order of one epoch: a permutation of range(size) fixed by (seed, epoch)."""
    return np.random.default_rng([seed & 0xFFFFFFFF, epoch, size]).permutation(size)
