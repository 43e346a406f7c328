"""The calc environment: its calculator refuses everything but bounded arithmetic, and its
turns are tool calls until a final answer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from grpo_stream.config import load_config
from grpo_stream.envs.base import Step
from grpo_stream.envs.calc import (
    MAX_CHARS,
    MAX_EXPONENT,
    CalcEnv,
    CalcError,
    calculate,
    evaluate,
    final_answer,
)
from grpo_stream.envs.presets import task_preset
from grpo_stream.envs.registry import env_factory
from grpo_stream.envs.sandbox import EnvPool
from grpo_stream.models.loading import resolve_model


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("37*48", 1776),
        ("2+3*4", 14),
        ("(2+3)*4", 20),
        ("-7+2", -5),
        ("--3", 3),
        ("+4", 4),
        ("7/2", 3.5),
        ("7//2", 3),
        ("-7//2", -4),
        ("7%3", 1),
        ("2**10", 1024),
        (" 1.5*2 ", 3.0),
    ],
)
def test_arithmetic_follows_python_precedence_and_operators(expr: str, value: float) -> None:
    assert evaluate(expr) == value


@pytest.mark.parametrize(
    "expr",
    [
        "x+1",  # a name
        "abs(-3)",  # a call
        "(1).real",  # attribute access
        "__import__('os').system('true')",
        "'ab'*3",  # a string
        "True+1",  # a bool is not a number here
        "1j*1j",  # complex
        "[1][0]",  # a subscript
        "1 if 1 else 2",
        "1<2",
        "lambda: 1",
        "(x := 3)",
    ],
)
def test_anything_but_numbers_and_operators_is_refused(expr: str) -> None:
    with pytest.raises(CalcError):
        evaluate(expr)


def test_an_exponent_past_the_bound_is_refused_before_it_is_computed() -> None:
    with pytest.raises(CalcError, match="exponent"):
        evaluate("10**100000000")  # would take minutes and gigabytes if computed
    with pytest.raises(CalcError, match="exponent"):
        evaluate(f"2**{MAX_EXPONENT + 1}")
    with pytest.raises(CalcError, match="exponent"):
        evaluate("2**-1")


def test_a_result_past_the_magnitude_bound_is_refused() -> None:
    with pytest.raises(CalcError, match="too large"):
        evaluate("99999999*99999999")
    with pytest.raises(CalcError, match="too large"):
        evaluate("9" * 30)
    with pytest.raises(CalcError, match="too large"):
        evaluate("1e300*1e300")


def test_chained_powers_stay_bounded() -> None:
    with pytest.raises(CalcError):
        evaluate("9**9**9")  # 9**(9**9): the exponent is past the bound


def test_an_expression_past_the_length_bound_is_refused_unparsed() -> None:
    with pytest.raises(CalcError, match="longer"):
        evaluate("(" * (MAX_CHARS + 1))


@pytest.mark.parametrize("expr", ["", "1+", "((1)", "1 2", "\x00"])
def test_malformed_input_is_refused(expr: str) -> None:
    with pytest.raises(CalcError, match="malformed"):
        evaluate(expr)


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        ("37*48", "1776"),
        ("6/3", "2"),
        ("1/3", "0.333333"),
        ("1/0", "error: division by zero"),
        ("5%0", "error: division by zero"),
        ("5//0.0", "error: division by zero"),
        ("x", "error: unsupported Name"),
    ],
)
def test_the_tool_answers_a_value_or_one_error_line(expr: str, text: str) -> None:
    assert calculate(expr) == text


def test_the_final_answer_is_the_last_integer_of_the_reply() -> None:
    assert final_answer("1776") == 1776
    assert final_answer("it is -45") == -45
    assert final_answer("3 then 4") == 4
    assert final_answer("none") is None


def problem(answer: int, turns: int = 3) -> CalcEnv:
    env = CalcEnv(turns=turns)
    env.reset("37*48=", {"answer": answer})
    return env


def test_a_tool_call_then_the_right_answer_ends_with_reward_one() -> None:
    env = problem(1776)
    assert env.step("<calc>37*48</calc>") == Step("[1776]", 0.0, False)
    assert env.step("1776") == Step("", 1.0, True)


def test_a_wrong_final_answer_ends_the_episode_without_reward() -> None:
    assert problem(1776).step("1777") == Step("", 0.0, True)


def test_a_bad_expression_is_an_error_observation_and_the_episode_goes_on() -> None:
    env = problem(0)
    assert env.step("<calc>1/0</calc>") == Step("[error: division by zero]", 0.0, False)
    assert env.step("<calc>37*</calc>") == Step("[error: malformed expression]", 0.0, False)
    assert env.step("0") == Step("", 1.0, True)


def test_an_unclosed_tool_call_is_an_error_observation() -> None:
    env = problem(1776)
    assert env.step("<calc>37*48") == Step("[error: <calc> without </calc>]", 0.0, False)


def test_tool_calls_up_to_the_turn_limit_end_the_episode_unrewarded() -> None:
    env = problem(1776, turns=2)
    env.step("<calc>37*48</calc>")
    assert env.step("<calc>37*48</calc>") == Step("[1776]", 0.0, True)


def test_the_sandboxed_pool_plays_calc_turns(make_pool: Callable[..., EnvPool]) -> None:
    pool = make_pool("calc", max_turns=3)
    assert pool.reset({7: ("12*3=", {"answer": 36})})[7].step == Step()
    assert pool.step({7: "<calc>12*3</calc>"})[7].step == Step("[36]", 0.0, False)
    assert pool.step({7: "36"})[7].step == Step("", 1.0, True)


def test_the_calc_preset_is_a_valid_config_with_the_shipped_model() -> None:
    cfg = load_config(None, task_preset("calc"))
    assert (cfg.env.name, cfg.task.name) == ("calc", "calc")
    assert Path(resolve_model(cfg.model.name_or_path), "model.safetensors").is_file()
    env = env_factory(cfg.env)()
    assert isinstance(env, CalcEnv) and env.turns == cfg.env.max_turns
