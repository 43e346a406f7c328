"""RUN_DIR/metrics.jsonl: one JSON object per trainer step (the run directory contract)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_stream.jsonl import read_rows

if TYPE_CHECKING:  # an annotation only: the report's child reads metrics without the wire
    from grpo_stream.protocols.messages import StepStats

UPDATE_COLUMNS = ("kl", "loss", "grad_norm", "grad_norm_after", "tau", "reg_fired", "clip_frac")
"""The columns of the regularized GRPO update itself (`TrainState.train_step`'s metrics)."""

REQUIRED = (
    "step",
    "reward_mean",
    "reward_std",
    *UPDATE_COLUMNS,
    "policy_version",
    "staleness_mean",
    "groups_trained",
    "groups_filtered",
    "groups_stale",
    "tokens",
    "step_seconds",
    "wall_time",
)


def hub_columns(stats: StepStats) -> dict[str, Any]:
    """The columns of a step's row that come from the hub's statistics (`TrainBatch.stats`):
    every one is a field of the typed StepStats, so none can be missing."""
    rates = dict(zip(stats.gen_instances, stats.gen_tokens_per_s, strict=True))
    return {
        "reward_mean": stats.reward_mean,
        "reward_std": stats.reward_std,
        "pass_rate": stats.pass_rate,
        "staleness_mean": stats.staleness_mean,
        "staleness_counts": stats.staleness_counts,
        "groups_trained": stats.groups_trained,
        "groups_filtered": stats.groups_filtered,
        "groups_stale": stats.groups_stale,
        "groups_failed": stats.groups_failed,
        "groups_redispatched": stats.groups_redispatched,
        "tokens_per_s": sum(rates.values()),  # all generators together
        "gen_tokens_per_s": rates,
        "gen_wait_s": stats.gen_wait_s,
        "step_groups": stats.step_groups,
        "groups_refilled": stats.groups_refilled,
        "signal_rate": stats.signal_rate,
        "distill_kl": stats.distill_kl,
        "scorer_cpu_s_per_completion": stats.scorer_cpu_s_per_completion,
    }


class MetricsWriter:
    """Appends one line per step; non-finite floats are written as null (valid JSON)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ValueError(f"metrics row lacks {missing}")
        self._fh.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of RUN_DIR/metrics.jsonl, safe on a live run (`grpo_stream.jsonl`)."""
    return read_rows(Path(run_dir) / "metrics.jsonl")
