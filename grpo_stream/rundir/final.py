"""The final state of a run that is over, read from its run directory alone.

What `status` shows when no hub of the run is alive: how it ended (RUN_DIR/outcome.json;
`dead` when its `up` was killed before it could say), the steps trained, the hub's
accounting counters (RUN_DIR/hub/counters.json), the last metrics line and the complete
checkpoints.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpo_stream.jsonl import last_row
from grpo_stream.rundir.outcome import read_outcome

SHOWN_METRICS = ("reward_mean", "pass_rate", "kl", "loss", "grad_norm", "policy_version")
"""Metrics of the last step that the table shows (--json gives the whole line)."""


@dataclass(frozen=True)
class FinalState:
    """A finished or dead run, as its directory tells it."""

    run_dir: str
    ended: str  # completed, interrupted, failed, dead
    reason: str
    ended_at: str
    steps: int
    counters: dict[str, int]
    last_metrics: dict[str, Any]
    checkpoints: list[int]


def final_state(run_dir: Path) -> dict[str, Any]:
    """The run's final state, as a JSON-ready object."""
    last = last_row(run_dir / "metrics.jsonl") or {}
    steps = int(last.get("step", 0)) if last else 0
    outcome = read_outcome(run_dir)
    if outcome is None:
        ended, reason, when = "dead", "its `up` stopped without recording an end (killed?)", None
    else:
        ended, reason, when = outcome.ended, outcome.reason, outcome.wall_time
        steps = max(steps, outcome.steps)
    state = FinalState(
        run_dir=str(run_dir),
        ended=ended,
        reason=reason,
        ended_at=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if when else "",
        steps=steps,
        counters=final_counters(run_dir),
        last_metrics=last,
        checkpoints=complete_steps(run_dir),
    )
    return asdict(state)


def render_final(state: dict[str, Any]) -> str:
    """A few readable lines of a final state."""
    ended = state["ended"] + (f" at {state['ended_at']}" if state["ended_at"] else "")
    lines = [f"run {state['run_dir']}: {ended} after {state['steps']} steps (no live hub)"]
    if state["reason"]:
        lines.append(f"  why: {state['reason']}")
    metrics = state["last_metrics"]
    shown = [f"{k}={_fmt(metrics[k])}" for k in SHOWN_METRICS if k in metrics]
    if shown:
        lines.append(f"  last step: {' '.join(shown)}")
    if state["counters"]:
        lines.append("  groups: " + " ".join(f"{k}={v}" for k, v in state["counters"].items()))
    checkpoints = state["checkpoints"]
    lines.append(
        f"  checkpoints: {', '.join(f'step-{s}' for s in checkpoints)}"
        if checkpoints
        else "  checkpoints: none"
    )
    if state["ended"] in ("interrupted", "dead") and checkpoints:
        lines.append(f"  continue it: grpo-stream up --resume --run-dir {state['run_dir']}")
    return "\n".join(lines)


def complete_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints, oldest first: the layout that
    grpo_stream.training.checkpoint writes (checkpoints/step-N/COMPLETE), read without
    importing torch so that `status` answers at once."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    steps = [
        int(child.name[5:])
        for child in root.iterdir()
        if child.name.startswith("step-")
        and child.name[5:].isdigit()
        and (child / "COMPLETE").exists()
    ]
    return sorted(steps)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def final_counters(run_dir: Path) -> dict[str, int]:
    """The hub's accounting counters as its last checkpoint wrote them (RUN_DIR/hub)."""
    try:
        data = json.loads((run_dir / "hub" / "counters.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}
