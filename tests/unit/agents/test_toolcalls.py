"""The one parser of function calls: what a reply's calls are, what is malformed and why,
and the round trip with the formatter (a hypothesis property)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_stream.agents.toolcalls import (
    CLOSE,
    OPEN,
    ToolCall,
    forced_prefix,
    format_call,
    format_reply,
    parse_reply,
    unknown_tool,
)


def test_a_reply_with_one_call_splits_into_content_and_the_call() -> None:
    got = parse_reply('let me compute <tool_call>{"name": "calc", "arguments": {"expr": "2*3"}}'
                      "</tool_call>")  # fmt: skip
    assert got.content == "let me compute"
    assert got.calls == [ToolCall("calc", {"expr": "2*3"})] and got.malformed is None


def test_several_calls_keep_their_order_and_text_between_them_is_content() -> None:
    second = '{"name": "b", "arguments": {"x": 1}}'
    text = f'{OPEN}{{"name": "a"}}{CLOSE} and {OPEN}\n{second}\n{CLOSE}'
    got = parse_reply(text)
    assert [c.name for c in got.calls] == ["a", "b"]
    assert got.calls[0].arguments == {} and got.calls[1].arguments == {"x": 1}
    assert got.content == "and"


def test_a_reply_without_calls_is_all_content() -> None:
    assert parse_reply("  1776 ") == parse_reply("1776")
    assert parse_reply("1776").calls == [] and parse_reply("").content is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (f"{OPEN}{{'name': 'calc'}}{CLOSE}", "not valid JSON"),
        (f'{OPEN}{{"name": "calc", "arguments": {{"expr": "1"}}', f"{OPEN} without {CLOSE}"),
        (f"{OPEN}[1, 2]{CLOSE}", "JSON list, not an object"),
        (f'{OPEN}{{"arguments": {{}}}}{CLOSE}', "has no name"),
        (f'{OPEN}{{"name": ""}}{CLOSE}', "has no name"),
        (f'{OPEN}{{"name": "calc", "arguments": "2*3"}}{CLOSE}', "arguments of calc are"),
        (f"text {CLOSE}", f"{CLOSE} without {OPEN}"),
        (f'{OPEN}{{"name": "a"}}{CLOSE}{OPEN}oops{CLOSE}', "not valid JSON"),
    ],
)
def test_malformed_calls_say_why_and_yield_no_calls(text: str, why: str) -> None:
    got = parse_reply(text)
    assert got.malformed is not None and why in got.malformed
    assert got.calls == []  # never half of a reply's calls


def test_a_call_to_a_tool_not_offered_is_named() -> None:
    calls = [ToolCall("calc", {}), ToolCall("search", {})]
    assert unknown_tool(calls, ["calc", "search"]) is None
    assert unknown_tool(calls, ["calc"]) == "no tool named 'search' (tools: calc)"


def test_a_forced_named_prefix_completes_to_a_parsable_call() -> None:
    assert forced_prefix("") == OPEN
    text = forced_prefix("calc") + '{"expr": "1+1"}}' + CLOSE
    assert parse_reply(text).calls == [ToolCall("calc", {"expr": "1+1"})]
    assert format_call(ToolCall("calc", {"expr": "1+1"})).startswith(forced_prefix("calc"))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)  # fmt: skip
CALLS = st.lists(
    st.builds(ToolCall, st.text(min_size=1), st.dictionaries(st.text(), JSON, max_size=4)),
    max_size=3,
)
CONTENT = st.none() | st.text().filter(lambda t: OPEN not in t and CLOSE not in t)


@given(CONTENT, CALLS)
def test_parse_reads_back_what_format_writes(content: str | None, calls: list[ToolCall]) -> None:
    got = parse_reply(format_reply(content, calls))
    assert got.malformed is None
    assert got.calls == calls
    assert got.content == ((content or "").strip() or None)


@given(st.dictionaries(st.text(), JSON, max_size=4))
def test_a_call_is_one_json_object_between_the_tags(arguments: dict[str, Any]) -> None:
    text = format_call(ToolCall("f", arguments))
    assert text.startswith(OPEN) and text.endswith(CLOSE)
    assert json.loads(text[len(OPEN) : -len(CLOSE)]) == {"name": "f", "arguments": arguments}


def test_an_argument_holding_the_closing_tag_does_not_end_the_call() -> None:
    call = ToolCall("echo", {"text": f"a {CLOSE} b {OPEN}"})
    got = parse_reply(format_reply("x", [call, ToolCall("calc", {})]))
    assert got.calls == [call, ToolCall("calc", {})] and got.content == "x"
