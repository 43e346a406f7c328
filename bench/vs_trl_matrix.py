"""bench.vs_trl's workload matrix: cells we did not tune for, each ours against TRL's.

`python -m bench.vs_trl --matrix` runs every cell of `CELLS`: a base workload (the tiny
model, arith's short prompts, at most 8 completion tokens, G = 8, 16 prompts a step) and
cells that each change one dimension of a parent cell (the base, or the long-prompt cell):
the model (the 10x Qwen2, a ~1M-parameter Qwen2 with a word-level tokenizer, a GPT-2; see
bench/vs_trl_model.py), the prompt (countdown's ~295 tokens, the models' context raised to
512), the completion (long-tailed up to 128 tokens) or G (4, 16). A cell is one run of
bench.vs_trl (`run_cell`: each side `--repeats` times, alternating, ours on
`run.torch_threads = auto`, TRL on every core); the steps of each cell keep the whole matrix
near 30 minutes on the 2-core machine at `--repeats 1` (the estimate is printed first).

Per cell it prints the settings, both sides' steady steps/s, the ratio, and each side's mean
reward over the same last steps (both sides run the same number). The last line:
`matrix ours/trl steps/s: geomean G, min M`. Results: bench/results/vs_trl_matrix.json.

Models the matrix builds go to a temporary directory, or once into `--keep DIR` (DIR/10x,
DIR/word, DIR/gpt2, each reused while its build.json asks for the same build).

`--smoke`: every cell's settings built and checked, every builder run with one SFT step,
the cells' models prepared (context, parameters), and one cell (the base, or the first of
`--cells`) run for 2 steps of 2 prompts x 2 per side; results go to a temporary directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import TINY_MODEL, environment, fmt, results_path, save_json
from bench.vs_trl_cell import cell_model, check_args, recorded_args, run_cell
from bench.vs_trl_model import (
    SMALL_POSITIONS,
    build_10x,
    build_gpt2,
    build_word,
    cached_build,
    cached_info,
)

LONG_CONTEXT = 512  # countdown's prompts, ~295 tokens with the tiny tokenizer, need it
STARTUP_S = 30.0
"""Seconds a cell costs besides its steps, per repeat (both sides' start-up; estimate)."""
BUILD_S = {"10x": 120.0, "word": 30.0, "gpt2": 30.0}
"""Seconds each built model takes (estimate, at the default SFT caps)."""
CELL_OWNED = ("steps", "group_size", "max_tokens", "task", "context", "model", "size",
              "last_k", "keep_10x", "only")  # fmt: skip
"""bench.vs_trl options each cell sets: --matrix refuses them."""
Builder = Callable[[Path], dict[str, Any]]
"""Builds a model into the directory it is given; returns its build info."""


@dataclass(frozen=True)
class ModelKind:
    """What a cell may ask of a model."""

    rotary: bool
    """Rotary positions: its context can be raised past the 64 positions it was built with."""
    any_text: bool
    """Its tokenizer spells any text (the word-level one: digits, + and = only)."""


MODELS = {
    "tiny": ModelKind(rotary=True, any_text=True),
    "10x": ModelKind(rotary=True, any_text=True),
    "word": ModelKind(rotary=True, any_text=False),
    "gpt2": ModelKind(rotary=False, any_text=True),
}
DIMENSIONS = ("model", "task", "max_tokens", "group_size")
"""What a cell varies: the model, the prompt (arith short, countdown long), the completion
length, G."""


@dataclass(frozen=True)
class Cell:
    """One workload of the matrix."""

    name: str
    parent: str
    """The cell this one changes one dimension of ("" for the base)."""
    model: str = "tiny"
    task: str = "arith"
    max_tokens: int = 8
    group_size: int = 8
    steps: int = 60
    step_s: float = 0.5
    """Seconds one step takes, ours and TRL's together (estimate: docs/results.md's
    2026-12-03 rates where measured, scaled from them where not)."""

    @property
    def context(self) -> int:
        return LONG_CONTEXT if self.task == "countdown" else 0

    @property
    def last_k(self) -> int:
        """The steps whose mean reward each side reports: the last quarter."""
        return max(1, self.steps // 4)


CELLS = [
    Cell("base", "", steps=60, step_s=0.48),
    Cell("g4", "base", group_size=4, steps=60, step_s=0.3),
    Cell("g16", "base", group_size=16, steps=40, step_s=0.9),
    Cell("word", "base", model="word", steps=60, step_s=0.45),
    Cell("gpt2", "base", model="gpt2", steps=60, step_s=0.5),
    Cell("10x", "base", model="10x", steps=24, step_s=2.6),
    Cell("long-prompt", "base", task="countdown", steps=16, step_s=2.5),
    Cell("long-completion", "long-prompt", task="countdown", max_tokens=128, steps=8,
         step_s=9.4),
]  # fmt: skip


def add_options(parser: argparse.ArgumentParser) -> None:
    """The matrix's options on bench.vs_trl's parser."""
    parser.add_argument("--matrix", action="store_true", help="run the workload matrix")
    parser.add_argument(
        "--cells", type=cells_arg, default=None, metavar="NAME,...",
        help=f"matrix: only these cells (of {', '.join(c.name for c in CELLS)})",
    )  # fmt: skip
    parser.add_argument(
        "--keep", type=Path, default=None, metavar="DIR",
        help="matrix: build its models into DIR once and reuse them (DIR/10x, word, gpt2)",
    )  # fmt: skip
    parser.add_argument(
        "--small-sft-steps", type=int, default=600, help="matrix: word and gpt2 SFT cap"
    )


def cells_arg(text: str) -> list[str]:
    """--cells: a comma list of cell names, each known; returned in the matrix's order."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = names - {c.name for c in CELLS}
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown cells {sorted(unknown)}; known: {', '.join(c.name for c in CELLS)}"
        )
    return [c.name for c in CELLS if c.name in names]


def check_cell(cell: Cell) -> None:
    """Raise SystemExit unless `cell` is a workload its model can run and it changes one
    dimension of its parent."""
    kind = MODELS.get(cell.model)
    if kind is None:
        raise SystemExit(f"cell {cell.name}: unknown model {cell.model!r}")
    if cell.task != "arith" and not kind.any_text:
        raise SystemExit(f"cell {cell.name}: the {cell.model} tokenizer spells arith only")
    if cell.context > SMALL_POSITIONS and not kind.rotary:
        raise SystemExit(f"cell {cell.name}: {cell.model} has {SMALL_POSITIONS} positions")
    if cell.parent:
        parent = next(c for c in CELLS if c.name == cell.parent)
        changed = [d for d in DIMENSIONS if getattr(cell, d) != getattr(parent, d)]
        if len(changed) != 1:
            raise SystemExit(f"cell {cell.name}: changes {changed} of {parent.name}, not one")


def cell_args(args: argparse.Namespace, cell: Cell, model_path: str) -> argparse.Namespace:
    """bench.vs_trl's options for `cell` (the matrix's others pass through), checked; the
    smoke run shrinks them to 2 steps of 2 prompts x 2, at most 4 tokens."""
    fields = {"steps": cell.steps, "group_size": cell.group_size, "task": cell.task,
              "max_tokens": cell.max_tokens, "context": cell.context, "model": model_path,
              "size": "tiny", "last_k": cell.last_k, "only": "both", "keep_10x": None}  # fmt: skip
    if args.smoke:
        fields.update(steps=2, prompts_per_step=2, group_size=2, last_k=1,
                      max_tokens=min(cell.max_tokens, 4), repeats=1)  # fmt: skip
    out = argparse.Namespace(**{**vars(args), **fields})
    check_args(out)
    return out


def settings(cell: Cell, run_args: argparse.Namespace) -> str:
    """What a cell runs, as its run's options say (the smoke run's, shrunk)."""
    a = run_args
    return (f"{cell.model}, {a.task}, <= {a.max_tokens} tokens, {a.prompts_per_step} prompts"
            f" x G {a.group_size}, {a.steps} steps")  # fmt: skip


def check_matrix_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[Cell]:
    """The cells to run; SystemExit when an option that each cell sets was given."""
    given = [k for k in CELL_OWNED if getattr(args, k) != parser.get_default(k)]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise SystemExit(f"--matrix sets {flags} per cell; leave them out")
    if args.small_sft_steps < 0:
        raise SystemExit("--small-sft-steps must be >= 0")
    for cell in CELLS:
        check_cell(cell)
    return [c for c in CELLS if args.cells is None or c.name in args.cells]


def estimate_s(cells: list[Cell], repeats: int, builds: list[str]) -> float:
    """Seconds the matrix should take: builds, then each cell's start-up and steps."""
    runs = sum(STARTUP_S + cell.steps * cell.step_s for cell in cells)
    return sum(BUILD_S[name] for name in builds) + repeats * runs


def geomean_min(ratios: list[float]) -> tuple[float, float]:
    """Geometric mean and minimum of the ratios (NaN if any is not a positive number)."""
    if not ratios or not all(r > 0 for r in ratios):  # NaN compares False
        return math.nan, math.nan
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios)), min(ratios)


def matrix_line(ratios: list[float]) -> str:
    geomean, lowest = geomean_min(ratios)
    return f"matrix ours/trl steps/s: geomean {fmt(geomean)}, min {fmt(lowest)}"


# ---- models and runs ----------------------------------------------------------------------


def model_builds(args: argparse.Namespace) -> dict[str, tuple[dict[str, Any], Builder]]:
    """Each model the matrix builds: what its build.json must ask for, and its builder (the
    smoke run: one SFT step each)."""
    caps = {"10x": args.sft_steps, "word": args.small_sft_steps, "gpt2": args.small_sft_steps}
    if args.smoke:
        caps = dict.fromkeys(caps, 1)
    builders: dict[str, Builder] = {
        "10x": lambda out: build_10x(TINY_MODEL, out, args.seed, caps["10x"]),
        "word": lambda out: build_word(out, args.seed, caps["word"]),
        "gpt2": lambda out: build_gpt2(TINY_MODEL, out, args.seed, caps["gpt2"]),
    }
    wanted = {name: {"model": name, "seed": args.seed, "sft_cap": cap, "base": TINY_MODEL}
              for name, cap in caps.items()}  # fmt: skip
    return {name: (wanted[name], builders[name]) for name in builders}


def keep_dir(args: argparse.Namespace) -> Path | None:
    """--keep, except in the smoke run (its one-step models must not replace kept ones)."""
    return None if args.smoke else args.keep


def to_build(args: argparse.Namespace, cells: list[Cell]) -> list[str]:
    """The models the cells need that are not kept already."""
    needed = sorted({c.model for c in cells} - {"tiny"})
    keep = keep_dir(args)
    builds = model_builds(args)
    return [n for n in needed if keep is None or cached_info(keep / n, builds[n][0]) is None]


def build_models(args: argparse.Namespace, cells: list[Cell], tmp: Path) -> dict[str, Any]:
    """Each model the cells need, name -> build info with its path ("tiny": shipped)."""
    models: dict[str, Any] = {"tiny": {"path": TINY_MODEL}}
    keep = keep_dir(args)
    for name, (wanted, build) in model_builds(args).items():
        if name not in {c.model for c in cells}:
            continue
        info = build(tmp / name) if keep is None else cached_build(keep / name, wanted, build)
        print(f"model {name}: {json.dumps(info)}", flush=True)
        models[name] = info
    return models


def prepare(args: argparse.Namespace, cell: Cell, models: dict[str, Any], tmp: Path) -> str:
    """A cell checked before any cell runs: its options, and its model as its run will
    prepare it (context raised, parameters counted)."""
    cell_tmp = tmp / f"cell-{cell.name}"
    cell_tmp.mkdir()
    run_args = cell_args(args, cell, models[cell.model]["path"])
    _, info = cell_model(run_args, cell_tmp)
    params = info["parameters"] / 1e6
    return f"cell {cell.name} [{settings(cell, run_args)}]: ready, {params:.2f}M params"


@dataclass(frozen=True)
class CellResult:
    """One cell's outcome: both sides' steady steps/s and mean reward of the same last `k`
    steps (NaN where a side did not finish), and the run's full record."""

    cell: Cell
    settings: str
    ours_steps_per_s: float
    trl_steps_per_s: float
    k: int
    reward_ours: float
    reward_trl: float
    run: dict[str, Any]
    """bench.vs_trl's record of the run (args, model, threads, summary, series), or its error."""

    @property
    def ratio(self) -> float:
        return self.ours_steps_per_s / self.trl_steps_per_s

    def line(self) -> str:
        return (
            f"cell {self.cell.name} [{self.settings}]: ours {fmt(self.ours_steps_per_s, 3)} "
            f"steps/s, trl {fmt(self.trl_steps_per_s, 3)}, ratio {fmt(self.ratio)}; reward "
            f"last{self.k} ours {fmt(self.reward_ours)} trl {fmt(self.reward_trl)}"
        )

    def to_json(self) -> dict[str, Any]:
        workload = dataclasses.asdict(self.cell) | {"context": self.cell.context}
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return fields | {"cell": workload, "ratio": self.ratio}


def run_one(args: argparse.Namespace, cell: Cell, model_path: str) -> CellResult:
    """One cell, both sides, its line printed. A run of ours that fails (RuntimeError: it
    exited early or ran past --timeout) is recorded with NaN rates, and the matrix goes on."""
    run_args = cell_args(args, cell, model_path)
    k = run_args.last_k
    try:
        (ours, trl), run = run_cell(run_args)
    except RuntimeError as error:
        print(f"cell {cell.name} failed: {error}", flush=True)
        nan = math.nan
        return CellResult(cell, settings(cell, run_args), nan, nan, k, nan, nan,
                          {"error": str(error)})  # fmt: skip
    run |= {"summary": {s.name: s.summary(k) for s in (ours, trl)},
            "series": [s.to_json() for s in (ours, trl)]}  # fmt: skip
    result = CellResult(cell, settings(cell, run_args), ours.steps_per_s(), trl.steps_per_s(),
                        k, ours.reward_last(k), trl.reward_last(k), run)  # fmt: skip
    print(result.line(), flush=True)
    return result


def run_matrix(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """`python -m bench.vs_trl --matrix`: builds, every cell checked, the cells run."""
    cells = check_matrix_args(args, parser)
    builds = to_build(args, cells)
    minutes = estimate_s(cells, args.repeats, builds) / 60
    print(f"matrix: {len(cells)} cells at --repeats {args.repeats}, models to build "
          f"{builds or 'none'}: estimate about {minutes:.0f} min on the 2-core machine "
          "(docs/results.md's 2026-12-03 rates; load slows it)", flush=True)  # fmt: skip
    run = cells[:1] if args.smoke else cells
    if args.smoke:
        print(f"smoke: every cell checked, models of 1 SFT step, cell {run[0].name} run for 2 "
              "steps a side", flush=True)  # fmt: skip
    shared = {k: v for k, v in recorded_args(args).items() if k not in CELL_OWNED}
    result: dict[str, Any] = {"args": shared, "env": environment()}
    checked = CELLS if args.smoke else cells  # every one checked before any runs
    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp:
        models = build_models(args, checked, Path(tmp))
        result["models"] = models
        for cell in checked:
            print(prepare(args, cell, models, Path(tmp)), flush=True)
        outcomes = [run_one(args, cell, models[cell.model]["path"]) for cell in run]
    result["cells"] = [outcome.to_json() for outcome in outcomes]
    ratios = [outcome.ratio for outcome in outcomes]
    result["geomean"], result["min"] = geomean_min(ratios)
    print("--- matrix")
    for outcome in outcomes:
        print(outcome.line())
    if not args.no_save:
        path = save_json(results_path("vs_trl_matrix.json"), result)
        print(f"saved {path}")
    print(matrix_line(ratios))
