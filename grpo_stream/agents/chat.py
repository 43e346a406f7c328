"""An agent's conversation as token ids: what the chat template adds between model turns.

The trajectory of an episode is built by appending ids: the first request's messages
rendered by the tokenizer's chat template (tools included) and tokenized, then, turn by
turn, the ids the policy sampled as sampled, and the template's text for the messages the
agent added since (tool results, user turns, the next generation prompt) tokenized alone.
The model's own turns are never re-rendered nor re-tokenized: the template decides only
what comes after the end-of-turn token the policy sampled.

That text is the difference of two renderings, `render(history + new, generation prompt)`
minus `render(history)`, cut after the last end-of-turn text of the history (the tail of
the model's last message as the template would write it is the model's own, already in
the trajectory; what follows its end-of-turn token, a newline say, is the template's). A
template that does not render the history identically once messages are added (Qwen3 drops
earlier reasoning after a new user message) is rendered again after a stub of the history (a
user turn, and the model's last message with neutral content and its calls); if that is not
incremental either, the request is refused.

Invariants:
- the history compared with each request is what the agent was shown: its own messages and
  the replies the endpoint returned (`same_message`); an agent that edits either, changes
  the tools mid-episode, or sends two conversations is refused with the reason;
- a message the agent never saw (a malformed call and the tool error that answered it) is
  in the rendered history, so later turns are rendered after it, as the model saw it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo_stream.agents.toolcalls import ToolCall

Message = dict[str, Any]
"""A message in the chat template's shape: role, content (text), tool_calls (arguments as
objects), tool_call_id, name."""

ROLES = ("system", "developer", "user", "assistant", "tool")
_STUB_USER: Message = {"role": "user", "content": "u"}
_STUB_REPLY = "x"


class RequestError(ValueError):
    """The request cannot extend its episode (the message is the HTTP 400's)."""


@dataclass
class Conversation:
    """One episode's conversation as the trajectory holds it."""

    tools: list[dict[str, Any]] | None = None
    rendered: list[Message] = field(default_factory=list)
    """Every message of the trajectory, in order, hidden turns (malformed calls) included."""
    visible: list[int] = field(default_factory=list)
    """Indices in `rendered` of the messages the agent has (sent or been shown)."""
    last_end: str | None = None
    """The end-of-turn text the policy's last turn ended with (None: it did not end)."""
    head: str | None = None
    """The rendering the policy's last turn followed (its generation prompt included): the
    start of that turn's message in the next rendering, which then needs no extra one."""

    def shown(self) -> list[Message]:
        return [self.rendered[i] for i in self.visible]


def text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RequestError(f"{where}: only text content parts are supported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise RequestError(f"{where}: content must be a string, null or a list of text parts")


def normalize(raw: Any, index: int) -> Message:
    """One request message in the template's shape (RequestError naming what is wrong)."""
    where = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise RequestError(f"{where} is not an object")
    role = raw.get("role")
    if role not in ROLES:
        raise RequestError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
    msg: Message = {"role": "system" if role == "developer" else role}
    msg["content"] = text_of(raw.get("content"), where)
    if role == "assistant" and raw.get("tool_calls"):
        msg["tool_calls"] = [
            _call_of(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(raw["tool_calls"])
        ]
    if role == "tool":
        msg["tool_call_id"] = str(raw.get("tool_call_id") or "")
    if isinstance(raw.get("name"), str) and role != "assistant":
        msg["name"] = raw["name"]
    return msg


def _call_of(raw: Any, where: str) -> dict[str, Any]:
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(f"{where} needs function.name")
    arguments = fn.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise RequestError(f"{where}.function.arguments is not JSON") from None
    if not isinstance(arguments, dict):
        raise RequestError(f"{where}.function.arguments is not a JSON object")
    call_id = str(raw.get("id") or "")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": fn["name"], "arguments": arguments},
    }


def assistant_message(content: str | None, calls: Sequence[ToolCall], ids: list[str]) -> Message:
    """The template-shaped message of a reply the endpoint returns."""
    msg: Message = {"role": "assistant", "content": content or ""}
    if calls:
        msg["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c, i in zip(calls, ids, strict=True)
        ]
    return msg


def same_message(ours: Message, theirs: Message) -> bool:
    """Whether the agent's copy says what the trajectory holds."""
    keys = ("role", "content", "tool_call_id", "name")
    if any(ours.get(k) != theirs.get(k) for k in keys):
        return False
    return bool(ours.get("tool_calls", []) == theirs.get("tool_calls", []))


def new_messages(conv: Conversation, messages: list[Message]) -> list[Message]:
    """The messages of a request past the conversation the agent was shown (RequestError
    when the request does not extend it)."""
    shown = conv.shown()
    if len(messages) < len(shown):
        raise RequestError(
            f"the request has {len(messages)} messages, fewer than the {len(shown)} this "
            "episode already holds: an episode is one growing conversation"
        )
    for i, (ours, theirs) in enumerate(zip(shown, messages, strict=False)):
        if not same_message(ours, theirs):
            raise RequestError(
                f"messages[{i}] ({theirs.get('role')}) differs from what this episode holds: "
                "an episode's history cannot be edited (its tokens are already sampled)"
            )
    return messages[len(shown) :]


def _stub(history: list[Message]) -> list[Message]:
    """A user turn and the last reply with neutral content (its calls kept): what a template
    needs to render the next messages, without what it renders otherwise once they come."""
    last = next(m for m in reversed(history) if m["role"] == "assistant")
    return [_STUB_USER, {**last, "content": _STUB_REPLY}]


class ChatFormat:
    """Renders and tokenizes conversations for one tokenizer's chat template."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "env.agent's chat endpoint needs a tokenizer with a chat template "
                "(model.name_or_path names one without); /v1/completions needs none"
            )
        self.tokenizer = tokenizer
        self.eos_text: str = tokenizer.eos_token or ""

    def render(
        self, messages: list[Message], tools: list[dict[str, Any]] | None, generation: bool
    ) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation
        )
        return str(text)

    def ids(self, text: str) -> list[int]:
        out: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return out

    def prompt(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> list[int]:
        """The ids of an episode's first request (its messages and the generation prompt)."""
        if not messages:
            raise RequestError("messages is empty")
        return self.ids(self.render(messages, tools, generation=True))

    def turn(self, conv: Conversation, new: list[Message]) -> list[int]:
        """The ids between the policy's last sampled token and its next turn."""
        return self.ids(self.turn_text(conv, new))

    def turn_text(self, conv: Conversation, new: list[Message]) -> str:
        """The text between the policy's last sampled token and its next turn."""
        return self.next_turn(conv, new)[0]

    def next_turn(self, conv: Conversation, new: list[Message]) -> tuple[str, str]:
        """(the text between the policy's last sampled token and its next turn, the
        conversation rendered up to that next turn: the `head` the next reply follows)."""
        lead = "" if conv.last_end is not None else self.eos_text  # close a cut turn
        delta, after = self._delta(conv.rendered, new, conv.tools, conv.last_end, conv.head)
        if delta is None:  # the history re-renders otherwise: a neutral stub of it
            delta, _ = self._delta(_stub(conv.rendered), new, conv.tools, conv.last_end, None)
        if delta is None:
            raise RequestError(
                "the chat template does not render this conversation incrementally (adding "
                "messages changes how the earlier ones render), so its next turn has no "
                "token-exact form"
            )
        return lead + delta, after

    def _delta(
        self,
        history: list[Message],
        new: list[Message],
        tools: list[dict[str, Any]] | None,
        end: str | None,
        head: str | None,
    ) -> tuple[str | None, str]:
        before = self.render(history, tools, generation=False)
        after = self.render([*history, *new], tools, generation=True)
        if not after.startswith(before):
            return None, after
        cut = self._end_of_last(history, before, tools, end, head)
        return before[cut:] + after[len(before) :], after

    def _end_of_last(
        self,
        history: list[Message],
        before: str,
        tools: list[dict[str, Any]] | None,
        end: str | None,
        head: str | None,
    ) -> int:
        """Where the template's text after the model's last message begins in `before`: past
        the end-of-turn text within that message's rendering (all of it when the template
        writes none there). `head`: the rendering the message followed, when known."""
        if head is None or not before.startswith(head):
            head = self.render(history[:-1], tools, generation=True) if history[:-1] else ""
        start = len(head) if before.startswith(head) else 0
        region = before[start:]
        marks = [m for m in (end, self.eos_text) if m and m in region]
        if not marks:
            return len(before)
        return start + max(region.rfind(m) + len(m) for m in marks)
