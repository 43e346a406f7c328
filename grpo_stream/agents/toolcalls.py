"""Function calls in a model's reply: the one parser, shared by training and evaluation.

Every path that turns a sampled reply into tool calls goes through `parse_reply`: the
generator's OpenAI-compatible endpoint (training episodes, and any evaluation served by it),
the in-process calc-tools environment the benchmark compares it with, and the tests. So a
call parses the same in training and in evaluation (verl#7177, verifiers#2027 are what two
parsers do).

The format is the Hermes one, which Qwen2.5, Qwen3 and Hermes chat templates use:

    free text<tool_call>{"name": "calc", "arguments": {"expr": "37*48"}}</tool_call>

- `content` is the reply with every `<tool_call>...</tool_call>` block removed, stripped of
  surrounding white space; None when nothing is left;
- each block holds one JSON object with a non-empty string `name` and an object
  `arguments` (absent means {}); white space around the JSON is allowed; a block ends at
  the first `</tool_call>` that closes whole JSON (an argument may contain the tag);
- anything else where a call was meant is `malformed` with the reason: invalid JSON, not an
  object, no name, arguments that are not an object, a `<tool_call>` never closed, a
  `</tool_call>` never opened. A malformed reply yields no calls (half a reply's calls
  would run tools the model did not finish asking for).

Invariant (tests/unit/agents/test_toolcalls.py, a hypothesis property): for any content
without the tags and any calls, `parse_reply(format_reply(content, calls))` gives back the
stripped content and the same calls.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One function call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into text and calls; `malformed` says why a meant call is not one."""

    content: str | None
    calls: list[ToolCall] = field(default_factory=list)
    malformed: str | None = None


def parse_reply(text: str) -> ParsedReply:
    """Split a reply into its content and tool calls (see the module docstring)."""
    pieces: list[str] = []
    calls: list[ToolCall] = []
    rest = text
    while True:
        start, stray = rest.find(OPEN), rest.find(CLOSE)
        if stray != -1 and (start == -1 or stray < start):
            return ParsedReply(_content(text), malformed=f"{CLOSE} without {OPEN}")
        if start == -1:
            pieces.append(rest)
            return ParsedReply(_content("".join(pieces)), calls)
        pieces.append(rest[:start])
        call, rest = _block(rest[start + len(OPEN) :])
        if isinstance(call, str):
            return ParsedReply(_content(text), malformed=call)
        calls.append(call)


def _block(after: str) -> tuple[ToolCall | str, str]:
    """The call that opens `after` and the text past its closing tag, or why there is none.
    The block ends at the first closing tag after which the JSON is whole (an argument may
    contain the tag itself)."""
    end = after.find(CLOSE)
    if end == -1:
        return f"{OPEN} without {CLOSE}", ""
    first: ToolCall | str | None = None
    while end != -1:
        call = _call(after[:end])
        if not isinstance(call, str):
            return call, after[end + len(CLOSE) :]
        first = first or call
        end = after.find(CLOSE, end + 1)
    return first or "", ""


def _call(block: str) -> ToolCall | str:
    """The call in one block, or why it is not one."""
    try:
        value = json.loads(block)
    except (json.JSONDecodeError, RecursionError) as exc:
        return f"the tool call is not valid JSON ({_reason(exc)})"
    if not isinstance(value, dict):
        return f"the tool call is a JSON {type(value).__name__}, not an object"
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return "the tool call has no name"
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return f"the arguments of {name} are a JSON {type(arguments).__name__}, not an object"
    return ToolCall(name, arguments)


def _reason(exc: Exception) -> str:
    return exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deep"


def _content(text: str) -> str | None:
    stripped = text.strip()
    return stripped or None


def format_call(call: ToolCall) -> str:
    """One call as the model writes it."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"{OPEN}{body}{CLOSE}"


def format_reply(content: str | None, calls: Sequence[ToolCall]) -> str:
    """A reply with `content` then `calls`: what `parse_reply` reads back."""
    return (content or "") + "".join(format_call(c) for c in calls)


def forced_prefix(name: str) -> str:
    """The text put after the generation prompt when a call is required (tool_choice
    "required": `name` empty) or a call to `name` is: the model writes the rest."""
    if not name:
        return OPEN
    return OPEN + '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '


def unknown_tool(calls: Sequence[ToolCall], tools: Sequence[str]) -> str | None:
    """Why a call names no offered tool (None when every call does); a call to a tool the
    request did not offer is malformed too."""
    for call in calls:
        if call.name not in tools:
            offered = ", ".join(tools) or "none"
            return f"no tool named {call.name!r} (tools: {offered})"
    return None
