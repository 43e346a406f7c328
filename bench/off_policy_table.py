"""bench.off_policy's results: gains per cell, the ratio table, its JSON and plot, and merging
the results files of several partial runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS_DIR, environment, save_json

MODES = ("none", "behaviour", "tis", "decoupled", "tis+bclip")
"""The corrections compared (`algo.loss.off_policy`; +bclip: with `algo.loss.behaviour_clip`),
in the table's column order."""


def mean_gain(runs: list[dict[str, Any]], initial: float) -> tuple[float, float]:
    """Mean and spread (half the max - min range) over seeds of final reward - initial."""
    gains = [r["final_reward"] - initial for r in runs]
    return float(np.mean(gains)), float((max(gains) - min(gains)) / 2)


def cells(runs: list[dict[str, Any]]) -> dict[tuple[int, int, str], list[dict[str, Any]]]:
    """Runs by (staleness, reuse, mode): one per seed."""
    out: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for r in runs:
        out.setdefault((r["staleness"], r["reuse"], r["mode"]), []).append(r)
    return out


def plot(path: Path, runs: list[dict[str, Any]], initial: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = cells(runs)
    stale = sorted({r["staleness"] for r in runs})
    reuses = sorted({r["reuse"] for r in runs})
    fig, axes = plt.subplots(1, len(reuses), figsize=(6 * len(reuses), 4), dpi=100, squeeze=False)
    width = 0.8 / len(MODES)
    on = by.get((0, 1, "tis"))
    for ax, reuse in zip(axes[0], reuses, strict=True):
        for j, mode in enumerate(MODES):
            xs, ys, es = [], [], []
            for i, s in enumerate(stale):
                if (s, reuse, mode) in by:
                    m, e = mean_gain(by[(s, reuse, mode)], initial)
                    xs.append(i + (j - 1.5) * width)
                    ys.append(m)
                    es.append(e)
            if xs:
                ax.bar(xs, ys, width * 0.9, yerr=es, capsize=2, label=mode)
        if on:
            ax.axhline(mean_gain(on, initial)[0], color="k", lw=0.8, ls="--", label="on-policy")
        ax.set_xticks(range(len(stale)), [f"staleness {s}" for s in stale])
        ax.set_title(f"reuse {reuse}")
        ax.set_ylabel("held-out reward gain (mean over seeds, bar: half range)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def summarise(runs: list[dict[str, Any]], initial: float, name: str, args: dict[str, Any]) -> None:
    """Print and write the table (mean gain / on-policy mean gain, with the seeds' spread),
    the JSON and the plot; the last line is the staleness-4 ratio."""
    by = cells(runs)
    on = by.get((0, 1, "tis"))
    on_gain = mean_gain(on, initial)[0] if on else math.nan
    head = "| staleness | reuse | " + " | ".join(MODES) + " |"
    lines = [
        f"initial held-out reward {initial:.4f}; on-policy gain {on_gain:+.4f} "
        f"(staleness 0, reuse 1, tis, mean over seeds)",
        "",
        "Gain / on-policy gain, mean over seeds (+- half the range of the seeds' gains / "
        "on-policy gain):",
        "",
        head,
        "|" + "---|" * (len(MODES) + 2),
    ]
    table: dict[str, dict[str, list[float]]] = {}
    for reuse in sorted({r["reuse"] for r in runs}):
        for s in sorted({r["staleness"] for r in runs}):
            row = {}
            for m in MODES:
                if (s, reuse, m) in by:
                    g, e = mean_gain(by[(s, reuse, m)], initial)
                    row[m] = [g / on_gain, e / abs(on_gain), len(by[(s, reuse, m)])]
            if row:
                table[f"s{s}_r{reuse}"] = row
                cell = " | ".join(
                    f"{row[m][0]:.2f} +- {row[m][1]:.2f}" if m in row else "-" for m in MODES
                )
                lines.append(f"| {s} | {reuse} | {cell} |")
    text = "\n".join(lines)
    print("\n" + text)
    out = RESULTS_DIR / f"{name}.json"
    save_json(
        out,
        {
            "args": args,
            "initial_reward": initial,
            "onpolicy_gain": on_gain,
            "ratios": table,
            "runs": runs,
            "environment": environment(),
        },
    )
    (RESULTS_DIR / f"{name}.md").write_text(text + "\n")
    plot(RESULTS_DIR / f"{name}.png", runs, initial)
    print(f"wrote {out}")
    four = table.get("s4_r1", {})
    best = max(v[0] for v in four.values()) if four and on_gain > 0 else math.nan
    if not on_gain > 0:
        print(f"on-policy gain {on_gain:+.4f} <= 0: the gain ratios mean nothing here")
    print(f"staleness4 best/onpolicy gain ratio: {best:.3f}")


def merged(names: list[str]) -> tuple[list[dict[str, Any]], float, dict[str, Any]]:
    """The runs of several results files (later files win a repeated cell and seed)."""
    runs: dict[tuple[int, str, int, int], dict[str, Any]] = {}
    initial, args = math.nan, {}
    for name in names:
        path = Path(name) if name.endswith(".json") else RESULTS_DIR / f"{name}.json"
        data = json.loads(path.read_text())
        if math.isfinite(initial) and abs(data["initial_reward"] - initial) > 1e-9:
            raise SystemExit(f"{path}: another held-out set (initial reward differs)")
        initial, args = data["initial_reward"], data["args"]
        for r in data["runs"]:
            runs[(r["staleness"], r["mode"], r["reuse"], r["seed"])] = r
    return list(runs.values()), initial, args
