"""bench.off_policy's results: gains per cell, the ratio table, its JSON and plot, and merging
the results files of several partial runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS_DIR, environment, results_path, save_json

MODES = (
    "none",
    "behaviour",
    "tis",
    "decoupled",
    "tis+bclip",
    "icepop",
    "seq_tis",
    "tis+geo",
    "tis+mean",
)
"""The corrections compared (`algo.loss.off_policy`; +bclip: with `algo.loss.behaviour_clip`;
+geo, +mean: with `algo.loss.seq_mask` geometric, arithmetic), in the table's column order."""


def seed_gains(runs: list[dict[str, Any]], initial: float) -> dict[int, float]:
    """final reward - initial of each seed's run of one cell."""
    return {int(r["seed"]): float(r["final_reward"]) - initial for r in runs}


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (sample sd / sqrt(n); nan with one value)."""
    n = len(values)
    mean = float(np.mean(values))
    return mean, float(np.std(values, ddof=1) / math.sqrt(n)) if n > 1 else math.nan


def ratio_se(cell: dict[int, float], on: dict[int, float]) -> tuple[float, float]:
    """R = mean cell gain / mean on-policy gain and its standard error by the delta method:
    over the seeds both have, paired, se = sd(c_k - R o_k) / sqrt(n) / |mean o| (the
    correlation of a seed's two runs counts); otherwise as independent means,
    sqrt(se_c^2 + R^2 se_o^2) / |mean o|."""
    (mc, sc), (mo, so) = mean_se(list(cell.values())), mean_se(list(on.values()))
    r = mc / mo
    if set(cell) == set(on) and len(cell) > 1:
        resid = [cell[k] - r * on[k] for k in cell]
        return r, float(np.std(resid, ddof=1) / math.sqrt(len(resid)) / abs(mo))
    return r, math.sqrt(sc**2 + r**2 * so**2) / abs(mo)


def paired(cell: dict[int, float], base: dict[int, float]) -> tuple[float, float, int]:
    """Mean and standard error of cell - base gain over the seeds both have, and how many."""
    common = sorted(set(cell) & set(base))
    if not common:
        return math.nan, math.nan, 0
    mean, se = mean_se([cell[k] - base[k] for k in common])
    return mean, se, len(common)


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
                    m, e = mean_se(list(seed_gains(by[(s, reuse, mode)], initial).values()))
                    xs.append(i + (j - (len(MODES) - 1) / 2) * width)
                    ys.append(m)
                    es.append(e if math.isfinite(e) else 0.0)
            if xs:
                ax.bar(xs, ys, width * 0.9, yerr=es, capsize=2, label=mode)
        if on:
            on_mean = mean_se(list(seed_gains(on, initial).values()))[0]
            ax.axhline(on_mean, color="k", lw=0.8, ls="--", label="on-policy")
        ax.set_xticks(range(len(stale)), [f"staleness {s}" for s in stale])
        ax.set_title(f"reuse {reuse}")
        ax.set_ylabel("held-out reward gain (mean over seeds, bar: s.e.)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _rows(
    by: dict[tuple[int, int, str], list[dict[str, Any]]], initial: float
) -> tuple[dict[str, dict[str, dict[str, Any]]], list[str], list[str]]:
    """Per cell: gains by seed, mean gain and ratio with their s.e., and the paired
    difference from behaviour; and the two markdown tables' rows."""
    on = seed_gains(by[(0, 1, "tis")], initial) if (0, 1, "tis") in by else {}
    table: dict[str, dict[str, dict[str, Any]]] = {}
    main, diffs = [], []
    for s, reuse, mode in sorted(by, key=lambda c: (c[1], c[0], MODES.index(c[2]))):
        g = seed_gains(by[(s, reuse, mode)], initial)
        mean, se = mean_se(list(g.values()))
        r, rse = ratio_se(g, on) if on else (math.nan, math.nan)
        row: dict[str, Any] = {"gains": g, "gain": mean, "gain_se": se, "ratio": r}
        row["ratio_se"] = rse
        per_seed = ", ".join(f"{k}: {v:+.3f}" for k, v in sorted(g.items()))
        main.append(
            f"| {s} | {reuse} | {mode} | {per_seed} | {mean:+.4f} +- {se:.4f} | "
            f"{r:.2f} +- {rse:.2f} |"
        )
        base = by.get((s, reuse, "behaviour"))
        if base is not None and mode != "behaviour" and s > 0:
            d, dse, n = paired(g, seed_gains(base, initial))
            on_mean = mean_se(list(on.values()))[0] if on else math.nan
            row["minus_behaviour"] = {"gain": d, "se": dse, "seeds": n}
            diffs.append(
                f"| {s} | {reuse} | {mode} | {d:+.4f} +- {dse:.4f} | "
                f"{d / on_mean:+.2f} +- {dse / abs(on_mean):.2f} | {n} |"
            )
        table.setdefault(f"s{s}_r{reuse}", {})[mode] = row
    return table, main, diffs


def summarise(runs: list[dict[str, Any]], initial: float, name: str, args: dict[str, Any]) -> None:
    """Print and write the tables (gains per seed, mean gain and gain / on-policy gain with
    standard errors over seeds, paired differences from behaviour), the JSON and the plot;
    the last line is the staleness-4 ratio."""
    by = cells(runs)
    on = by.get((0, 1, "tis"))
    on_gain, on_se = mean_se(list(seed_gains(on, initial).values())) if on else (math.nan,) * 2
    table, main, diffs = _rows(by, initial)
    lines = [
        f"initial held-out reward {initial:.4f}; on-policy gain {on_gain:+.4f} +- {on_se:.4f} "
        f"(staleness 0, reuse 1, tis, mean +- s.e. over {len(on or [])} seeds)",
        "",
        "Gain = final held-out reward - initial; ratio = mean gain / on-policy mean gain "
        "(s.e. by the delta method, paired by seed):",
        "",
        "| staleness | reuse | correction | gain per seed | mean gain +- s.e. | ratio +- s.e. |",
        "|---|---|---|---|---|---|",
        *main,
    ]
    if diffs:
        lines += [
            "",
            "Paired by seed, gain minus behaviour's gain at the same staleness and reuse:",
            "",
            "| staleness | reuse | correction | mean +- s.e. | in on-policy gains | seeds |",
            "|---|---|---|---|---|---|",
            *diffs,
        ]
    text = "\n".join(lines)
    print("\n" + text)
    out = results_path(f"{name}.json")
    save_json(
        out,
        {
            "args": args,
            "initial_reward": initial,
            "onpolicy_gain": on_gain,
            "onpolicy_gain_se": on_se,
            "ratios": table,
            "runs": runs,
            "environment": environment(),
        },
    )
    results_path(f"{name}.md").write_text(text + "\n")
    plot(results_path(f"{name}.png"), runs, initial)
    print(f"wrote {out}")
    four = table.get("s4_r1", {})
    best_mode = max(four, key=lambda m: four[m]["ratio"]) if four and on_gain > 0 else None
    best = four[best_mode]["ratio"] if best_mode else math.nan
    if not on_gain > 0:
        print(f"on-policy gain {on_gain:+.4f} <= 0: the gain ratios mean nothing here")
    elif best_mode is not None:
        b = four[best_mode]
        print(f"staleness4 best: {best_mode} {best:.3f} +- {b['ratio_se']:.3f}", end="")
        d = b.get("minus_behaviour")
        if d is not None:
            print(f"; minus behaviour {d['gain']:+.4f} +- {d['se']:.4f} gain", end="")
        print()
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
