"""Smoke tests of the benchmarks: they import, parse their options, and ask for valid settings."""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from grpo_stream.config import load_config

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Import `bench.<name>` the way `python -m bench.<name>` does (repo root on sys.path)."""
    monkeypatch.syspath_prepend(str(REPO))

    def load(name: str) -> ModuleType:
        return importlib.import_module(f"bench.{name}")

    return load


def test_vs_trl_defaults_match_the_brief(bench: Callable[[str], ModuleType]) -> None:
    args = bench("vs_trl").build_parser().parse_args([])
    assert (args.prompts_per_step, args.group_size, args.max_tokens, args.size) == (
        16,
        8,
        8,
        "tiny",
    )


def test_vs_trl_parses_size_10x_and_steps(bench: Callable[[str], ModuleType]) -> None:
    args = bench("vs_trl").build_parser().parse_args(["--size", "10x", "--steps", "5"])
    assert (args.size, args.steps) == ("10x", 5)


def test_vs_trl_rejects_an_unknown_size(bench: Callable[[str], ModuleType]) -> None:
    with pytest.raises(SystemExit):
        bench("vs_trl").build_parser().parse_args(["--size", "huge"])


def test_vs_trl_rejects_one_step(bench: Callable[[str], ModuleType]) -> None:
    mod = bench("vs_trl")
    with pytest.raises(SystemExit):
        mod.check_args(mod.build_parser().parse_args(["--steps", "1"]))


def test_vs_trl_overrides_are_valid_run_settings(bench: Callable[[str], ModuleType]) -> None:
    mod = bench("vs_trl_cell")
    args = mod.build_parser().parse_args(["--prompts-per-step", "4", "--group-size", "3"])
    cfg = load_config(None, mod.ours_overrides(args, "some/model"))
    assert (cfg.hub.groups_per_step, cfg.generator.group_size, cfg.model.name_or_path) == (
        4,
        3,
        "some/model",
    )


def test_vs_trl_runs_ours_auto_and_trl_on_every_core(bench: Callable[[str], ModuleType]) -> None:
    import os

    mod = bench("vs_trl_cell")
    args = mod.build_parser().parse_args([])
    assert load_config(None, mod.ours_overrides(args, "m")).run.torch_threads == "auto"
    assert mod.trl_threads(args) == len(os.sched_getaffinity(0))


def test_vs_trl_long_workload_sets_the_task_for_both_sides(
    bench: Callable[[str], ModuleType],
) -> None:
    mod = bench("vs_trl_cell")
    args = mod.build_parser().parse_args(["--task", "countdown", "--max-tokens", "128"])
    cfg = load_config(None, mod.ours_overrides(args, "m"))
    assert (cfg.task.name, cfg.generator.max_tokens) == ("countdown", 128)
    problem = mod.load_problems(1, "countdown")[0]
    reference = json.dumps(dict(problem.reference))
    answer = (
        f"<answer> {_solve(problem.reference['numbers'], problem.reference['target'])} </answer>"
    )
    wrong = "<answer> 1 + 1 + 1 + 1 </answer>"
    scores = mod.trl_reward("countdown")([problem.prompt] * 2, [wrong, answer], [reference] * 2)
    assert scores[1] == 1.0 and scores[0] is not None and scores[0] < 1.0


def _solve(numbers: list[int], target: int) -> str:
    """An expression over some of `numbers` (each once) equal to `target`, by brute force."""
    import itertools
    from fractions import Fraction

    for size in range(1, len(numbers) + 1):
        for picked in itertools.permutations(numbers, size):
            for ops in itertools.product("+-*/", repeat=size - 1):
                text, value = str(picked[0]), Fraction(picked[0])
                for op, n in zip(ops, picked[1:], strict=True):
                    if op == "/" and n == 0:
                        break
                    value = {"+": value + n, "-": value - n, "*": value * n, "/": value / n}[op]
                    text = f"({text} {op} {n})"
                else:
                    if value == target:
                        return text
    raise AssertionError(f"no expression over {numbers} makes {target}")


def test_pipeline_trains_every_group(bench: Callable[[str], ModuleType]) -> None:
    mod = bench("vs_trl_cell")
    cfg = load_config(None, mod.ours_overrides(mod.build_parser().parse_args([]), "m"))
    assert cfg.algo.advantage.filter_zero_signal is False


def test_async_vs_sync_overrides_set_the_generator_count(
    bench: Callable[[str], ModuleType],
) -> None:
    mod = bench("async_vs_sync")
    args = mod.build_parser().parse_args(["--generators", "2"])
    assert load_config(None, mod.overrides(args)).generator.count == 2


def test_async_vs_sync_order_flags_are_exclusive(bench: Callable[[str], ModuleType]) -> None:
    with pytest.raises(SystemExit):
        bench("async_vs_sync").build_parser().parse_args(["--sync-first", "--async-first"])


def test_async_first_flag_flips_the_order(bench: Callable[[str], ModuleType]) -> None:
    args = bench("async_vs_sync").build_parser().parse_args(["--async-first"])
    assert args.sync_first is False


def test_up_command_adds_sync_last(bench: Callable[[str], ModuleType]) -> None:
    argv = bench("common").up_command(Path("/r"), 3, ["a.b=1"], sync=True)
    assert argv[-5:] == ["--max-steps", "3", "--set", "a.b=1", "--sync"]


def test_weights_defaults_to_bf16_fanout_1_4_16(bench: Callable[[str], ModuleType]) -> None:
    args = bench("weights").build_parser().parse_args([])
    assert (args.kind, args.dtype) == ("synthetic", "bf16")
    assert (args.fanout_receivers, args.fanout, args.delta_lrs) == ("1,4,16", 4, "1e-6,1e-5")


def test_weights_cpu_rates_are_gib_per_cpu_second_median_over_rounds(
    bench: Callable[[str], ModuleType],
) -> None:
    gib = 1 << 30

    def rnd(fetch: float, snapshot: float, send: float, sent_sets: int) -> dict[str, object]:
        return {"trainer_snapshot_cpu_s": snapshot, "trainer_send_cpu_s": send,
                "trainer_sent_bytes": sent_sets * 2 * gib,
                "receivers": [{"cpu_fetch_s": fetch, "cpu_apply_s": 0.5}]}  # fmt: skip

    result = {"bytes": 2 * gib, "rounds": [rnd(1.5, 1.0, 0.5, 4), rnd(3.5, 4.0, 2.0, 4)]}
    rates = bench("weights").cpu_rates(result)
    assert rates["receiver"] == pytest.approx(2 / 3.0)  # median of 2.0 and 4.0 CPU s
    assert rates["receiver_fetch"] == pytest.approx(2 / 2.5)
    assert rates["trainer_snapshot"] == pytest.approx(2 / 2.5)
    assert rates["trainer_send"] == pytest.approx((16 + 4) / 2)  # 4 sets sent per round


def test_weights_rejects_an_unknown_kind(bench: Callable[[str], ModuleType]) -> None:
    with pytest.raises(SystemExit):
        bench("weights").build_parser().parse_args(["--kind", "7b"])


def test_synthetic_set_has_qwen2_half_billion_parameters(
    bench: Callable[[str], ModuleType],
) -> None:
    mod = bench("weights_set")
    params = mod.shape_bytes(mod.qwen2_like_shapes(), 1)
    assert 490e6 < params < 500e6  # Qwen2-0.5B: 494M with tied embeddings


def test_fill_values_change_every_version(bench: Callable[[str], ModuleType]) -> None:
    mod = bench("weights_set")
    assert all(mod.fill_value(v, 3) != mod.fill_value(v + 1, 3) for v in range(100))


def test_series_rates_skip_the_first_step(
    bench: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    rows = [
        {"step": s, "wall_time": 10.0 + 2 * s, "reward_mean": 0.5, "tokens": 100} for s in (1, 2, 3)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    series = bench("common").series_from_metrics("x", tmp_path / "metrics.jsonl")
    assert (series.steps_per_s(), series.tokens_per_s()) == (0.5, 50.0)


def test_reward_means_skip_missing_rewards(bench: Callable[[str], ModuleType]) -> None:
    series = bench("common").StepSeries("x", rewards=[math.nan, 1.0, 0.0, 0.5])
    assert (series.reward_first(2), series.reward_last(2)) == (1.0, 0.25)


def test_off_policy_default_grid_is_reduced_and_full_is_the_whole_grid(
    bench: Callable[[str], ModuleType],
) -> None:
    mod = bench("off_policy")
    default = mod.grid(mod.build_parser().parse_args([]))
    assert default[0] == (0, "tis", 1, 0)  # the on-policy reference first
    assert sorted(default) == sorted((s, m, 1, 0) for s in (0, 4) for m in mod.MODES)
    full = mod.grid(mod.build_parser().parse_args(["--full", "--seeds", "0,1"]))
    assert len(full) == 4 * len(mod.MODES) * 2 * 2
    for mode in mod.MODES:  # every compared correction is a valid setting
        loss = load_config(None, mod.mode_settings(mode)).algo.loss
        mask = {"none": "", "geometric": "+geo", "arithmetic": "+mean"}[loss.seq_mask]
        label = loss.off_policy + ("+bclip" if loss.behaviour_clip else "") + mask
        assert label == mode


def test_off_policy_bclip_mode_turns_on_the_behaviour_clip(
    bench: Callable[[str], ModuleType],
) -> None:
    mod = bench("off_policy")
    assert load_config(None, mod.mode_settings("tis+bclip")).algo.loss.behaviour_clip
    assert not load_config(None, mod.mode_settings("tis")).algo.loss.behaviour_clip
    with pytest.raises(ValueError, match="unknown correction"):
        mod.mode_settings("tis+other")


def test_off_policy_s0_modes_runs_only_those_modes_at_staleness_0(
    bench: Callable[[str], ModuleType],
) -> None:
    mod = bench("off_policy")
    args = ["--s0-modes", "tis", "--modes", "behaviour,tis", "--staleness", "0,4"]
    runs = mod.grid(mod.build_parser().parse_args(args))
    assert runs == [(0, "tis", 1, 0), (4, "behaviour", 1, 0), (4, "tis", 1, 0)]


def test_off_policy_merge_keeps_one_run_per_cell_and_seed(
    bench: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    mod = bench("off_policy")

    def run(stale: int, seed: int, reward: float) -> dict[str, object]:
        return {"staleness": stale, "mode": "tis", "reuse": 1, "seed": seed, "final_reward": reward}

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"initial_reward": 0.2, "args": {}, "runs": [run(0, 0, 0.3)]}))
    b.write_text(
        json.dumps({"initial_reward": 0.2, "args": {}, "runs": [run(0, 0, 0.4), run(4, 1, 0.25)]})
    )
    runs, initial, _ = mod.merged([str(a), str(b)])
    assert initial == 0.2
    assert sorted((r["staleness"], r["seed"], r["final_reward"]) for r in runs) == [
        (0, 0, 0.4),
        (4, 1, 0.25),
    ]


def test_lora_searches_the_lrs_given_as_a_comma_list(bench: Callable[[str], ModuleType]) -> None:
    args = bench("lora").parse_args(["--lora-lrs", "1e-3,4e-3", "--part", "reward"])
    assert (args.lora_lrs, args.part) == ([1e-3, 4e-3], "reward")


def test_lora_rejects_an_unknown_part(bench: Callable[[str], ModuleType]) -> None:
    with pytest.raises(SystemExit):
        bench("lora").parse_args(["--part", "both"])


def test_vs_trl_context_copy_raises_the_model_context(
    bench: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    from transformers import AutoConfig

    mod = bench("vs_trl_model")
    path = mod.with_context("grpo-stream/tiny-arith", tmp_path / "long", 512)
    assert AutoConfig.from_pretrained(path).max_position_embeddings == 512
    assert mod.with_context("grpo-stream/tiny-arith", tmp_path / "same", 32) == (
        "grpo-stream/tiny-arith"
    )  # already long enough: no copy
    assert bench("vs_trl").build_parser().parse_args(["--context", "512"]).context == 512


def test_vs_trl_step_parses_its_options(bench: Callable[[str], ModuleType]) -> None:
    args = bench("vs_trl_step").build_parser().parse_args(["--steps", "3", "--profile"])
    assert args.steps == 3 and args.profile and args.group_size == 8


def test_vs_trl_records_keep_10x_as_json(bench: Callable[[str], ModuleType]) -> None:
    mod = bench("vs_trl_cell")
    args = mod.build_parser().parse_args(["--size", "10x", "--keep-10x", "/some/dir"])
    assert json.loads(json.dumps(mod.recorded_args(args)))["keep_10x"] == "/some/dir"
