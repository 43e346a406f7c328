"""bench.vs_trl's workload matrix: its cells, its summary line, its models, and its smoke run
(which needs TRL, the bench extra)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from grpo_stream.config import load_config

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "bench" / "results"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Import `bench.<name>` the way `python -m bench.<name>` does (repo root on sys.path)."""
    monkeypatch.syspath_prepend(str(REPO))
    return lambda name: importlib.import_module(f"bench.{name}")


@pytest.fixture
def matrix(bench: Callable[[str], ModuleType]) -> ModuleType:
    return bench("vs_trl_matrix")


@pytest.fixture
def models(bench: Callable[[str], ModuleType]) -> ModuleType:
    return bench("vs_trl_model")


@pytest.fixture
def parser(bench: Callable[[str], ModuleType]) -> argparse.ArgumentParser:
    """bench.vs_trl's command line (one cell's options, the matrix's, --smoke)."""
    built: argparse.ArgumentParser = bench("vs_trl").build_parser()
    return built


def test_the_cells_cover_every_dimension_the_issue_names(matrix: ModuleType) -> None:
    cells = matrix.CELLS
    assert {c.model for c in cells} == {"tiny", "10x", "word", "gpt2"}
    assert {c.task for c in cells} == {"arith", "countdown"}
    assert {c.max_tokens for c in cells} == {8, 128}
    assert {c.group_size for c in cells} == {4, 8, 16}
    assert [c.name for c in cells if not c.parent] == ["base"]


def test_every_cell_changes_one_dimension_of_its_parent(matrix: ModuleType) -> None:
    for cell in matrix.CELLS:
        matrix.check_cell(cell)  # raises SystemExit otherwise


def test_a_cell_that_changes_two_dimensions_is_refused(matrix: ModuleType) -> None:
    with pytest.raises(SystemExit, match="not one"):
        matrix.check_cell(matrix.Cell("bad", "base", model="word", group_size=4))


def test_countdown_is_refused_on_the_word_tokenizer(matrix: ModuleType) -> None:
    with pytest.raises(SystemExit, match="arith only"):
        matrix.check_cell(matrix.Cell("bad", "base", model="word", task="countdown"))


def test_a_long_context_is_refused_on_gpt2s_fixed_positions(matrix: ModuleType) -> None:
    with pytest.raises(SystemExit, match="positions"):
        matrix.check_cell(matrix.Cell("bad", "long-prompt", model="gpt2", task="countdown"))


def test_cells_option_keeps_the_matrix_order(matrix: ModuleType) -> None:
    assert matrix.cells_arg("10x, base") == ["base", "10x"]


def test_cells_option_refuses_an_unknown_cell(matrix: ModuleType) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="nope"):
        matrix.cells_arg("base,nope")


def test_matrix_refuses_an_option_each_cell_sets(
    matrix: ModuleType, parser: argparse.ArgumentParser
) -> None:
    args = parser.parse_args(["--matrix", "--steps", "5"])
    with pytest.raises(SystemExit, match="--steps"):
        matrix.check_matrix_args(args, parser)


def test_each_cells_options_are_valid_run_settings(
    bench: Callable[[str], ModuleType], matrix: ModuleType, parser: argparse.ArgumentParser
) -> None:
    cell_mod = bench("vs_trl_cell")
    args = parser.parse_args(["--matrix"])
    for cell in matrix.CELLS:
        run_args = matrix.cell_args(args, cell, "some/model")
        cfg = load_config(None, cell_mod.ours_overrides(run_args, "some/model"))
        assert (cfg.generator.group_size, cfg.generator.max_tokens, cfg.task.name) == (
            cell.group_size,
            cell.max_tokens,
            cell.task,
        )
        assert run_args.steps == cell.steps and run_args.context == cell.context


def test_the_smoke_run_shrinks_a_cell_to_two_steps_of_two_by_two(
    matrix: ModuleType, parser: argparse.ArgumentParser
) -> None:
    args = parser.parse_args(["--matrix", "--smoke"])
    cell = next(c for c in matrix.CELLS if c.name == "long-completion")
    run_args = matrix.cell_args(args, cell, "m")
    assert (run_args.steps, run_args.prompts_per_step, run_args.group_size) == (2, 2, 2)
    assert (run_args.max_tokens, run_args.context) == (4, 512)


def test_the_full_matrix_is_planned_under_thirty_minutes(matrix: ModuleType) -> None:
    assert matrix.estimate_s(matrix.CELLS, 1, ["10x", "word", "gpt2"]) < 30 * 60


def test_the_last_line_is_the_geometric_mean_and_the_minimum(matrix: ModuleType) -> None:
    assert matrix.matrix_line([1.0, 4.0]) == "matrix ours/trl steps/s: geomean 2.00, min 1.00"


def test_a_cell_without_a_rate_makes_the_summary_nan(matrix: ModuleType) -> None:
    assert matrix.matrix_line([2.0, float("nan")]).endswith("geomean nan, min nan")


def _series(common: ModuleType, name: str, step_s: float, reward: float) -> object:
    steps = [1, 2, 3, 4, 5]
    return common.StepSeries(name, steps=steps, wall_s=[step_s * i for i in steps],
                             rewards=[reward] * 5, completion_tokens=[10.0] * 5)  # fmt: skip


def test_a_cell_reports_both_rates_their_ratio_and_equal_step_rewards(
    bench: Callable[[str], ModuleType],
    matrix: ModuleType,
    parser: argparse.ArgumentParser,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    common = bench("common")
    ours, trl = _series(common, "ours", 0.25, 0.5), _series(common, "trl", 0.5, 0.25)
    monkeypatch.setattr(matrix, "run_cell", lambda run_args: ([ours, trl], {"model": {}}))
    cell = matrix.CELLS[0]
    outcome = matrix.run_one(parser.parse_args(["--matrix"]), cell, "m")
    assert (outcome.ours_steps_per_s, outcome.trl_steps_per_s, outcome.ratio) == (4.0, 2.0, 2.0)
    assert (outcome.k, outcome.reward_ours, outcome.reward_trl) == (cell.steps // 4, 0.5, 0.25)
    assert json.loads(json.dumps(outcome.to_json()))["cell"]["name"] == cell.name


def test_a_cell_whose_run_fails_is_recorded_as_nan_and_the_matrix_goes_on(
    matrix: ModuleType, parser: argparse.ArgumentParser, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(run_args: argparse.Namespace) -> None:
        raise RuntimeError("grpo-stream up exited with 1")

    monkeypatch.setattr(matrix, "run_cell", fail)
    outcome = matrix.run_one(parser.parse_args(["--matrix"]), matrix.CELLS[0], "m")
    assert math.isnan(outcome.ratio) and outcome.run == {"error": "grpo-stream up exited with 1"}
    assert matrix.matrix_line([2.0, outcome.ratio]).endswith("geomean nan, min nan")


def test_a_kept_build_is_reused_while_it_asks_for_the_same(
    models: ModuleType, tmp_path: Path
) -> None:
    built: list[Path] = []

    def build(out: Path) -> dict[str, object]:
        out.mkdir(exist_ok=True)
        built.append(out)
        return {"path": str(out), "n": len(built)}

    first = models.cached_build(tmp_path / "m", {"seed": 0}, build)
    again = models.cached_build(tmp_path / "m", {"seed": 0}, build)
    other = models.cached_build(tmp_path / "m", {"seed": 1}, build)
    assert (first["n"], again["n"], other["n"]) == (1, 1, 2)


def test_a_model_kept_for_the_same_build_is_not_built_again(
    matrix: ModuleType, parser: argparse.ArgumentParser, tmp_path: Path
) -> None:
    args = parser.parse_args(["--matrix", "--keep", str(tmp_path)])
    wanted = matrix.model_builds(args)["word"][0]
    (tmp_path / "word").mkdir()
    (tmp_path / "word" / "build.json").write_text(json.dumps({"path": "p", "wanted": wanted}))
    assert matrix.to_build(args, matrix.CELLS) == ["10x", "gpt2"]
    smoke = parser.parse_args(["--matrix", "--keep", str(tmp_path), "--smoke"])
    assert matrix.to_build(smoke, matrix.CELLS) == ["10x", "gpt2", "word"]  # never kept


def test_the_word_tokenizer_round_trips_arithmetic_as_transformers_loads_it(
    models: ModuleType, tmp_path: Path
) -> None:
    from grpo_stream.models.loading import load_tokenizer
    from grpo_stream.models.testing import qwen2_config

    built = models.word_tokenizer()
    built.save_pretrained(tmp_path)
    qwen2_config(len(built)).save_pretrained(tmp_path)  # loaded back beside a Qwen2
    loaded = load_tokenizer(str(tmp_path))
    assert len(loaded) == 16
    ids = loaded("16+4=")["input_ids"]
    assert ids == built("16+4=")["input_ids"]
    assert loaded.convert_ids_to_tokens(ids) == ["<bos>", "1", "6", "+", "4", "="]
    answer = loaded("20", add_special_tokens=False)["input_ids"]
    assert loaded.decode([*answer, loaded.eos_token_id], skip_special_tokens=True) == "20"


def test_the_gpt2_builder_makes_a_model_that_generates(models: ModuleType, tmp_path: Path) -> None:
    import torch

    from grpo_stream.models.loading import load_policy, load_tokenizer

    info = models.build_gpt2("grpo-stream/tiny-arith", tmp_path / "gpt2", seed=0, sft_steps=1)
    model = load_policy(info["path"], dtype="float32", trainable=False)
    tokenizer = load_tokenizer(info["path"])
    assert type(model).__name__ == "GPT2LMHeadModel"
    batch = tokenizer(["16+4=", "3+2="], return_tensors="pt", padding=True)
    width = batch["input_ids"].shape[1]
    torch.manual_seed(0)
    out = model.generate(**batch, do_sample=True, max_new_tokens=4,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    assert out.shape[0] == 2 and width < out.shape[1] <= width + 4
    assert all(isinstance(text, str) for text in tokenizer.batch_decode(out[:, width:]))
    tiny = load_tokenizer("grpo-stream/tiny-arith")
    assert tokenizer("16+4=")["input_ids"] == tiny("16+4=")["input_ids"]


@pytest.mark.skipif(
    importlib.util.find_spec("trl") is None,
    reason="needs TRL, an optional extra: pip install -e '.[bench]'",
)
@pytest.mark.timeout(600)  # about a minute alone; several on a loaded machine
def test_the_matrix_smoke_run_ends_with_its_line_and_writes_no_results() -> None:
    before = {p.name: p.stat().st_mtime for p in RESULTS.iterdir()}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "bench.vs_trl", "--smoke"],
        cwd=REPO, capture_output=True, text=True, timeout=560, env=env,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert re.search(r"^matrix ours/trl steps/s: geomean \d+\.\d+, min \d", lines[-1]), output
    assert sum(line.endswith("M params") for line in lines) == 8  # every cell prepared
    assert {p.name: p.stat().st_mtime for p in RESULTS.iterdir()} == before
