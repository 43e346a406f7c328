"""Optional metric sinks beside RUN_DIR/metrics.jsonl: TensorBoard and Weights & Biases.

Selected by `run.sinks` (e.g. ["tensorboard", "wandb"]). TensorBoard writes event files to
RUN_DIR/tensorboard; W&B logs to its project (set WANDB_MODE=offline to keep it on disk
under RUN_DIR/wandb). Numbers are sent every step, and the sample completions
(`run.log_completions`) as text; a sink that fails to start is an error that
names the missing package (`pip install "grpo-stream[sinks]"`).
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any, Protocol


class Sink(Protocol):
    def write(self, step: int, row: dict[str, Any]) -> None: ...

    def write_text(self, step: int, tag: str, text: str) -> None: ...

    def close(self) -> None: ...


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
    }


class TensorBoardSink:
    def __init__(self, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise RuntimeError(
                'run.sinks has "tensorboard": pip install "grpo-stream[sinks]"'
            ) from exc
        self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def write(self, step: int, row: dict[str, Any]) -> None:
        for key, value in _numbers(row).items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def write_text(self, step: int, tag: str, text: str) -> None:
        self._writer.add_text(tag, text, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise RuntimeError('run.sinks has "wandb": pip install "grpo-stream[sinks]"') from exc
        self._wandb = wandb
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "grpo-stream"),
            name=run_dir.name,
            dir=str(run_dir),
            config=config,
            # the mode comes from WANDB_MODE (offline keeps the run on disk)
        )

    def write(self, step: int, row: dict[str, Any]) -> None:
        self._run.log(_numbers(row), step=step)

    def write_text(self, step: int, tag: str, text: str) -> None:
        self._run.log({tag: self._wandb.Html(f"<pre>{html.escape(text)}</pre>")}, step=step)

    def close(self) -> None:
        self._run.finish()


def make_sinks(names: list[str], run_dir: Path, config: dict[str, Any]) -> list[Sink]:
    sinks: list[Sink] = []
    for name in names:
        sinks.append(
            TensorBoardSink(run_dir) if name == "tensorboard" else WandbSink(run_dir, config)
        )
    return sinks
