"""bench.time_to_reward: its tasks' data, the reward curves read from a run, the rule that
finds when a curve reaches a reward, and (slow, with TRL) its smoke run end to end."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bench.time_to_reward import (
    alternative,
    alternatives,
    compare,
    final_reward,
    reward_at,
    smoothed,
    time_to,
)
from bench.time_to_reward_runs import Curve, exact_reward, math_verify_reward, ours_curve
from bench.time_to_reward_tasks import LONG_MIN, long_answer, problem

REPO = Path(__file__).resolve().parents[3]


def curve(rewards: list[float], counts: list[int], seconds: list[float] | None = None) -> Curve:
    got = Curve("test")
    for i, (r, n) in enumerate(zip(rewards, counts, strict=True)):
        got.add(seconds[i] if seconds else float(i + 1), r, n)
    return got


def test_the_reward_at_a_moment_is_the_mean_of_the_last_window_of_completions() -> None:
    c = curve([0.0, 0.5, 1.0], [128, 128, 128])
    assert smoothed(c, window=256) == [0.0, 0.25, 0.75]
    small = curve([0.0, 1.0, 1.0, 0.0], [8, 8, 8, 8])
    assert smoothed(small, window=16) == [0.0, 0.5, 1.0, 0.5]


def test_the_final_reward_is_the_mean_of_the_last_quarter_of_completions() -> None:
    assert final_reward(curve([0.0] * 6 + [1.0, 1.0], [8] * 8)) == 1.0
    assert final_reward(curve([0.0, 0.2, 0.6], [16, 16, 32])) == 0.6


def test_a_curve_reaches_a_reward_when_its_smoothed_reward_first_does() -> None:
    c = curve([0.2, 0.4, 0.6, 0.6], [256] * 4, seconds=[10.0, 20.0, 30.0, 40.0])
    assert time_to(c, 0.4) == 20.0
    assert time_to(c, 0.7) == math.inf
    assert reward_at(c, 25.0) == 0.4 and math.isnan(reward_at(c, 5.0))


def test_ours_against_trl_is_the_time_each_took_to_reach_trls_final_reward() -> None:
    trl = curve([0.2, 0.3, 0.4, 0.5], [256] * 4, seconds=[30.0, 60.0, 90.0, 120.0])
    ours = curve([0.3, 0.5, 0.6], [256] * 3, seconds=[20.0, 40.0, 60.0])
    got = compare(ours, trl)
    assert got["trl_final"] == 0.5 and got["trl_time_s"] == 120.0 and got["ours_time_s"] == 40.0
    assert got["ratio"] == pytest.approx(1 / 3) and got["ours_at_trl_end"] == 0.6


def test_an_alternative_is_timed_to_the_matched_trls_final_reward_beside_ours() -> None:
    trl = curve([0.1, 0.3], [256, 256], seconds=[50.0, 100.0])
    ours = curve([0.2, 0.4], [256, 256], seconds=[20.0, 40.0])
    slower = curve([0.1, 0.2, 0.35], [256, 256, 256], seconds=[30.0, 60.0, 90.0])
    got = alternatives({"ours": ours, "trl-matched": trl, "ours+x": slower})["x"]
    assert got["level"] == 0.3 and got["ours_time_s"] == 40.0 and got["alt_time_s"] == 90.0
    assert got["alt_over_ours"] == 2.25 and got["alt_final"] == 0.35
    assert alternative("x:hub.max_staleness=2,run.torch_threads=2") == (
        "x",
        ["hub.max_staleness=2", "run.torch_threads=2"],
    )


def test_a_choice_answers_with_the_number_of_the_option_that_is_the_sum() -> None:
    rng = random.Random(3)
    for _ in range(50):
        question, answer = problem("choice", rng)
        left, options = question.split("=? options ")
        options = options.removesuffix(" pick 1-4:").split(",")
        a, b = (int(x) for x in left.split("+"))
        assert len(set(options)) == 4 and int(options[int(answer) - 1]) == a + b


def test_a_long_answer_restates_the_problem_to_64_characters_then_gives_the_sum() -> None:
    text = long_answer(3, 4)
    assert len(text) >= LONG_MIN and text.startswith("3+4=3+4=") and text.endswith("=7")
    assert math_verify_reward([text, long_answer(3, 5)], ["7", "7"]) == [1.0, 0.0]


def test_trls_choice_reward_is_the_answers_exact_text() -> None:
    assert exact_reward(["2", " 2", "12", "3"], ["2", "2", "2", "2"]) == [1.0, 1.0, 0.0, 0.0]


def test_our_curve_counts_the_filtered_groups_beside_the_trained(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "config.toml").write_text("[generator]\ngroup_size = 4\n")
    rows = [
        {"step": 1, "reward_mean": 0.25, "step_groups": 16, "groups_filtered": 4},
        {"step": 2, "reward_mean": 0.5, "step_groups": 16, "groups_filtered": 10},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    events = [{"event": "trainer.step", "step": s, "t": 1000.0 + 5 * s} for s in (1, 2)]
    (tmp_path / "logs" / "trainer-trainer-0.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in events)
    )
    got = ours_curve(tmp_path, start=1000.0)
    assert got.seconds == [5.0, 10.0] and got.rewards == [0.25, 0.5]
    assert got.counts == [4 * (16 + 4), 4 * (16 + 6)]


@pytest.mark.slow  # both sides for 45 s each, start-up included: about 2-4 minutes
@pytest.mark.timeout(900)
def test_the_smoke_run_ends_with_the_time_to_reward_line() -> None:
    if importlib.util.find_spec("trl") is None:
        pytest.skip("needs TRL (the bench extra)")
    done = subprocess.run(
        [sys.executable, "-m", "bench.time_to_reward", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=880,
    )
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert last.startswith("time to TRL's final reward, ours/TRL: choice "), last
