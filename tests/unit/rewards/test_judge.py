"""judge: a causal LM reads the rubric and writes a score; the score is parsed, cached, and an
output without one is a NaN reward counted "unparseable" in the scorer's sandbox, never a
crash. The shipped tiny judge agrees with exact_match on arith answers."""

from __future__ import annotations

import math
import re

import pytest

from grpo_stream.builds.judge import evaluation_set
from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards import RewardLoadError, load_reward
from grpo_stream.rewards.builtin import exact_match
from grpo_stream.rewards.judge import Judge, Unparsed, fill, parse
from grpo_stream.rewards.sandbox import RewardPool

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def test_fill_replaces_prompt_completion_and_reference_fields_only() -> None:
    template = "Q: {prompt} A: {completion} ref {answer} {other} {}"
    got = fill(template, "1+2=", "3", {"answer": 3})
    assert got == "Q: 1+2= A: 3 ref 3 {other} {}"


def test_fill_does_not_substitute_inside_the_values() -> None:
    assert fill("{prompt}|{completion}", "{completion}", "x", {}) == "{completion}|x"


def test_parse_reads_the_first_score_and_scales_it() -> None:
    assert parse("score: 7 of 10", NUMBER, 10.0) == pytest.approx(0.7)
    assert parse("verdict=1", re.compile(r"verdict=([01])"), 1.0) == 1.0
    assert parse("no idea", NUMBER, 1.0) == Unparsed("no idea")


def test_spec_needs_a_path_for_a_judge() -> None:
    with pytest.raises(ValueError, match="`path` goes with"):
        RewardSpec(name="judge")


def test_a_bad_pattern_or_param_is_a_load_error_naming_the_judge() -> None:
    with pytest.raises(RewardLoadError, match="pattern"):
        load_reward(RewardSpec(name="judge", path="grpo-stream/tiny-judge",
                               params={"pattern": "("}))  # fmt: skip
    with pytest.raises(RewardLoadError, match="params"):
        load_reward(RewardSpec(name="judge", path="grpo-stream/tiny-judge",
                               params={"temperature": 0.5}))  # fmt: skip


@pytest.fixture(scope="module")
def judge() -> Judge:
    return Judge.load("grpo-stream/tiny-judge", device="cpu", batch_size=8)


def test_the_tiny_judge_agrees_with_exact_match_as_its_build_measured(judge: Judge) -> None:
    held = evaluation_set(0)[:64]  # the builder's held-out examples (build_info: 0.846)
    agree = 0
    for prompt, completion, _ in held:
        a, b = (int(x) for x in prompt[:-1].split("+"))
        reference = {"answer": str(a + b)}
        want = exact_match(completion, prompt=prompt, reference=reference)
        agree += judge(completion, prompt=prompt, reference=reference) == want
    assert agree / len(held) >= 0.75


def test_the_tiny_judge_calls_right_answers_right_and_malformed_ones_wrong(judge: Judge) -> None:
    reference = {"answer": "12"}
    for right in ("12", " 12"):
        assert judge(right, prompt="5+7=", reference=reference) == 1.0
    for wrong in ("12+", "120", "1", "x"):  # (it calls "" and "13" right: build_judge)
        assert judge(wrong, prompt="5+7=", reference=reference) == 0.0


def test_batched_verdicts_match_one_at_a_time_and_repeats_hit_the_cache(judge: Judge) -> None:
    texts = ["12", "13", "", "12", "x1"]
    judged, hits = judge.judged, judge.hits
    batched = judge.score_batch(texts, prompt="5+7=", reference={"answer": "12"})
    assert judge.judged - judged <= 4 and judge.hits - hits >= 1  # "12" twice: judged once
    fresh = Judge.load("grpo-stream/tiny-judge", device="cpu", cache_size=0)
    assert [fresh(t, prompt="5+7=", reference={"answer": "12"}) for t in texts] == batched


def test_a_judge_that_writes_no_score_gives_unparsed_not_an_exception() -> None:
    # the arith policy as a judge: it writes digits, never "verdict=..."
    bad = Judge.load("grpo-stream/tiny-arith", pattern=r"verdict=(\d)", device="cpu")
    got = bad.score_batch(["3", "4"], prompt="1+2=", reference={})
    assert all(isinstance(v, Unparsed) for v in got)


@pytest.mark.slow
def test_in_the_sandbox_unparseable_output_is_a_nan_reward_and_a_count() -> None:
    specs = [
        RewardSpec(name="judge", path="grpo-stream/tiny-arith",
                   params={"pattern": r"verdict=(\d)", "device": "cpu"}),
        RewardSpec(name="judge", path="grpo-stream/tiny-judge", params={"device": "cpu"}),
    ]  # fmt: skip
    with RewardPool(specs, workers=1, timeout_s=60.0, memory_limit_mb=1024) as pool:
        result = pool.score("2+2=", ["4", "5"], {"answer": "4"})
        assert all(math.isnan(r) for r in result.rewards)  # a NaN component: NaN reward
        assert not any(math.isnan(v) for v in result.components[1])  # the real judge scored
        assert pool.stats()["failures"] == {"unparseable": 2}
        assert all("no score in the judge's" in e for e in result.errors)
        again = pool.score("2+2=", ["4"], {"answer": "4"})  # the pool keeps serving
        assert len(again.rewards) == 1
