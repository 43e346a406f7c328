"""RUN_DIR/report.png: reward (with held-out eval/pass@1, eval/pass@k from eval.jsonl), KL,
grad norm with tau, staleness, throughput, waits."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from grpo_stream.rundir.evals import read_eval
from grpo_stream.training.metrics import read_metrics


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(float(r["step"]))
            ys.append(float(v))
    return xs, ys


def _smooth(ys: list[float], k: int = 10) -> list[float]:
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= k:
            acc -= ys[i - k]
        out.append(acc / min(i + 1, k))
    return out


def _plot_eval(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Held-out evaluation on the reward panel: pass@1 and pass@k against the trainer step."""
    for key in ("eval/pass@1", "eval/pass@k"):
        xs, ys = _series(rows, key)
        if xs:
            k = rows[-1].get("eval/k", "k") if key.endswith("k") else 1
            ax.plot(xs, ys, marker="o", linestyle="--", label=f"held-out pass@{k}")


def write_report(run_dir: Path) -> Path | None:
    """Render the report from metrics.jsonl; atomic (temp file + rename). None if no data."""
    rows = read_metrics(run_dir)
    if not rows:
        return None
    # the object API with the Agg canvas: no pyplot state, safe in a background thread
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 7))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3)
    panels = [
        ("reward", ["reward_mean", "pass_rate"]),
        ("KL to reference", ["kl"]),
        ("grad norm / tau", ["grad_norm", "grad_norm_after", "tau"]),
        ("staleness (versions)", ["staleness_mean"]),
        ("completion tokens / s", ["tokens_per_s"]),
        ("trainer wait (s) / step time (s)", ["trainer_wait_s", "step_seconds"]),
    ]
    for ax, (title, keys) in zip(axes.flat, panels, strict=False):
        for key in keys:
            xs, ys = _series(rows, key)
            if xs:
                ax.plot(xs, ys, alpha=0.35 if key == "reward_mean" else 0.9, label=key)
                if key == "reward_mean":
                    ax.plot(xs, _smooth(ys), label="reward_mean (10-step mean)")
        if title == "reward":
            _plot_eval(ax, read_eval(run_dir))
        ax.set_title(title)
        ax.set_xlabel("trainer step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(f"grpo-stream run {Path(run_dir).name}")
    fig.tight_layout()
    out = Path(run_dir) / "report.png"
    tmp = out.with_name(".report.tmp.png")
    fig.savefig(tmp, dpi=80)
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m grpo_stream.report RUN_DIR`: render RUN_DIR/report.png once."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m grpo_stream.report RUN_DIR", file=sys.stderr)
        return 2
    write_report(Path(args[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
