"""What the dashboard reads from a run directory, a little at a time.

Files (each optional: a run that has not written one yet, or never will, shows without it):
- metrics.jsonl: one row per trainer step; the columns the charts draw are kept (`CHART_KEYS`);
- completions.jsonl: the sample completions `run.log_completions` writes (step, prompt,
  completion, reward, advantage, version, tokens), read with the trainer's own reader
  (`grpo_stream.training.samples.read_samples`) each time the file changed, the newest
  `MAX_COMPLETIONS` kept;
- eval.jsonl: one row per held-out evaluation;
- logs/*.jsonl: the services' events; warnings and errors become alarms (one per instance
  and event, counted), and every event tells which services ran, on which device, at which
  weights version (the graph of a run that is over).

Invariant: `collect` takes in only the rows added since the last call, and `apply` returns
exactly what it added to the kept state (the update a connected page applies), so the state a
page builds from a snapshot plus every later update equals a fresh `snapshot`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_stream.jsonl import JsonlTail
from grpo_stream.training import samples
from grpo_stream.training.metrics import UPDATE_COLUMNS

CHART_KEYS = (
    "step",
    "wall_time",
    "reward_mean",
    "pass_rate",
    *UPDATE_COLUMNS,
    "tokens_per_s",
    "step_seconds",
    "trainer_wait_s",
    "staleness_mean",
    "staleness_counts",
    "policy_version",
    "rollbacks",
    "groups_failed",
    "groups_filtered",
    "groups_stale",
    "lr",
    "gen_tokens_per_s",
    "scorer_cpu_s_per_completion",
)
"""Metrics columns the page uses (a row keeps those it has)."""
MAX_COMPLETIONS = 50
"""Sample completions kept (the newest)."""
MAX_ALARMS = 200
"""Distinct (instance, event) alarms kept (the most recent)."""
MAX_TEXT = 2000
"""Characters of a completion, a prompt or an alarm's text kept."""
ALARM_LEVELS = ("warning", "error", "critical")
ALARM_KINDS = {
    "hub.stall": "stall",
    "hub.stall_abort": "stall",
    "reward.error": "reward",
    "reward.failed": "reward",
    "grpo.rollback": "rollback",
    "grpo.rollback_limit": "rollback",
    "rollback.max_consecutive": "rollback",
}
"""Events with a kind of their own (others: their level, warning or error)."""
META_FIELDS = {"event", "level", "ts", "t", "service", "instance", "host", "logger"}


@dataclass
class Alarm:
    """A warning or error event of one instance, counted while it repeats."""

    kind: str  # stall, reward, rollback, error, warning
    level: str
    instance: str
    event: str
    text: str
    first_t: float
    last_t: float
    count: int = 1


@dataclass
class LoggedService:
    """A service instance as its log tells it."""

    service: str
    instance: str
    device: str = ""
    version: int | None = None  # the newest weights version it logged
    last_t: float = 0.0


@dataclass
class RunUpdate:
    """What one read added."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    completions: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    alarms: list[Alarm] = field(default_factory=list)  # new or counted again

    def as_json(self) -> dict[str, Any]:
        return {
            "metrics": self.metrics,
            "completions": self.completions,
            "evals": self.evals,
            "alarms": [asdict(a) for a in self.alarms],
        }


@dataclass
class Collected:
    """What the files gained, parsed but not yet taken into the kept state."""

    metrics: list[dict[str, Any]]
    completions: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    events: list[dict[str, Any]]


class RunFiles:
    """The run directory's files, followed. `collect` does the file I/O (a worker thread may
    run it, one call at a time); `apply` and `snapshot` touch only the kept state, so the
    caller runs them where updates are sent out, and a snapshot never falls between the two
    halves of an update."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._metrics_tail = JsonlTail(run_dir / "metrics.jsonl")
        self._samples = SampleFollower(run_dir)
        self._eval_tail = JsonlTail(run_dir / "eval.jsonl")
        self._log_tails: dict[Path, JsonlTail] = {}
        self.metrics: list[dict[str, Any]] = []
        self.completions: deque[dict[str, Any]] = deque(maxlen=MAX_COMPLETIONS)
        self.evals: list[dict[str, Any]] = []
        self.alarms: dict[tuple[str, str], Alarm] = {}
        self.logged: dict[str, LoggedService] = {}

    def collect(self) -> Collected:
        """Read what the files gained since the last call."""
        return Collected(
            metrics=[chart_row(r) for r in self._metrics_tail.read() if "step" in r],
            completions=[completion_row(r) for r in self._samples.read()],
            evals=self._eval_tail.read(),
            events=self._new_events(),
        )

    def apply(self, collected: Collected) -> RunUpdate:
        """Take `collected` into the kept state; return the update it makes."""
        self.metrics += collected.metrics
        self.completions.extend(collected.completions)
        self.evals += collected.evals
        alarms = self._take_events(collected.events)
        return RunUpdate(collected.metrics, collected.completions, collected.evals, alarms)

    def snapshot(self) -> dict[str, Any]:
        alarms = sorted(self.alarms.values(), key=lambda a: a.last_t, reverse=True)
        return {
            "metrics": list(self.metrics),
            "completions": list(self.completions),
            "evals": list(self.evals),
            "alarms": [asdict(a) for a in alarms],
        }

    def _new_events(self) -> list[dict[str, Any]]:
        logs = self.run_dir / "logs"
        paths = sorted(logs.glob("*.jsonl")) if logs.is_dir() else []
        events: list[dict[str, Any]] = []
        for path in paths:
            tail = self._log_tails.setdefault(path, JsonlTail(path))
            events += tail.read()
        events.sort(key=_event_time)
        return events

    def _take_events(self, events: list[dict[str, Any]]) -> list[Alarm]:
        changed: dict[tuple[str, str], Alarm] = {}
        for event in events:
            self._note_service(event)
            alarm = self._alarm(event)
            if alarm is not None:
                changed[(alarm.instance, alarm.event)] = alarm
        if len(self.alarms) > MAX_ALARMS:
            oldest = sorted(self.alarms, key=lambda k: self.alarms[k].last_t)
            for key in oldest[: len(self.alarms) - MAX_ALARMS]:
                del self.alarms[key]
        return [a for k, a in changed.items() if k in self.alarms]

    def _note_service(self, event: dict[str, Any]) -> None:
        instance, service = event.get("instance"), event.get("service")
        if not isinstance(instance, str) or not isinstance(service, str):
            return
        seen = self.logged.setdefault(instance, LoggedService(service, instance))
        seen.last_t = max(seen.last_t, _event_time(event))
        device = event.get("device")
        if isinstance(device, str) and device:
            seen.device = device
        version = event.get("version")
        if event.get("event") in ("weights.applied", "weights.published") and isinstance(
            version, int
        ):
            seen.version = version

    def _alarm(self, event: dict[str, Any]) -> Alarm | None:
        level = str(event.get("level", "info"))
        if level not in ALARM_LEVELS:
            return None
        name = str(event.get("event", ""))
        instance = str(event.get("instance", event.get("service", "?")))
        t = _event_time(event)
        text = " ".join(f"{k}={v}" for k, v in event.items() if k not in META_FIELDS)
        text = (str(event.get("line", "")) if name == "raw" else text)[:MAX_TEXT]
        known = self.alarms.get((instance, name))
        if known is not None:
            known.count += 1
            known.last_t, known.text, known.level = t, text, level
            return known
        kind = ALARM_KINDS.get(name, "error" if level != "warning" else "warning")
        alarm = Alarm(kind, level, instance, name, text, t, t)
        self.alarms[(instance, name)] = alarm
        return alarm


class SampleFollower:
    """RUN_DIR/completions.jsonl through `read_samples`, re-read only when the file changed
    (it grows every `run.log_completions` steps); each read returns the rows past those
    already returned. A file that shrank (rewritten) is returned again from its first row."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / samples.FILE
        self.returned = 0  # rows returned so far
        self._stamp: tuple[int, int] | None = None  # (size, mtime) the last read saw

    def read(self) -> list[dict[str, Any]]:
        try:
            st = self.path.stat()
        except OSError:
            return []
        stamp = (st.st_size, st.st_mtime_ns)
        if stamp == self._stamp:
            return []
        self._stamp = stamp  # taken before the read: a write after it changes the next one
        rows = samples.read_samples(self.run_dir)
        if len(rows) < self.returned:
            self.returned = 0
        new = rows[self.returned :]
        self.returned = len(rows)
        return new[-MAX_COMPLETIONS:]


def chart_row(row: dict[str, Any]) -> dict[str, Any]:
    """The columns of a metrics row that the page draws."""
    return {k: row[k] for k in CHART_KEYS if k in row}


def completion_row(row: dict[str, Any]) -> dict[str, Any]:
    """A logged completion with its long texts cut."""
    return {k: v[:MAX_TEXT] if isinstance(v, str) else v for k, v in row.items()}


def _event_time(event: dict[str, Any]) -> float:
    t = event.get("t")
    return float(t) if isinstance(t, (int, float)) else 0.0
