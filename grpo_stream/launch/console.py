"""What `up` shows: merged service logs, coloured by service, and a progress bar of steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

COLOURS = {"grouper": "magenta", "trainer": "cyan", "generator": "green", "scorer": "yellow"}
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


class RunConsole:
    """Renders events; `quiet` hides routine per-batch events below warning level."""

    def __init__(
        self, level: str = "info", quiet: bool = True, console: Console | None = None
    ) -> None:
        self.console = console or Console(stderr=True)
        self.min_level = LEVELS.get(level, 20)
        self.quiet = quiet
        self.progress: Progress | None = None
        self.task: Any = None
        self.last_reward: float | None = None

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
        self.console.print(Text(f"up: {text}", style="bold"))

    def event(self, event: dict[str, Any]) -> None:
        level = LEVELS.get(str(event.get("level", "info")), 20)
        name = str(event.get("event", ""))
        if event.get("event") == "trainer.step" and self.progress is not None:
            reward = event.get("reward")
            if isinstance(reward, (int, float)):
                self.last_reward = float(reward)
            self.progress.update(
                self.task,
                completed=int(event.get("step", 0)),
                info=f"reward {self.last_reward if self.last_reward is not None else '?'}",
            )
        if level < self.min_level or (self.quiet and name in QUIET and level < 30):
            return
        if self.quiet and name == "trainer.step" and int(event.get("step", 0)) % 10 not in (0, 1):
            return  # every tenth step is enough on the console; metrics.jsonl has them all
        service = str(event.get("service", "?"))
        who = Text(f"{event.get('instance', service):<12} ", style=COLOURS.get(service, "white"))
        style = "red" if level >= 40 else "yellow" if level >= 30 else ""
        body = " ".join(f"{k}={v}" for k, v in event.items() if k not in SKIP_FIELDS)
        line = event.get("line") if name == "raw" else f"{name} {body}"
        self.console.print(who + Text(str(line), style=style), highlight=False, soft_wrap=True)

    def finished(self, steps: int, run_dir: Path) -> None:
        if self.progress is not None:
            self.progress.stop()
        self.note(
            f"{steps} steps; metrics in {run_dir / 'metrics.jsonl'}, "
            f"report in {run_dir / 'report.png'}"
        )
