"""Conversations as token ids: the prompt is the template's rendering, each later turn is
what the template writes after the model's end-of-turn token, and a history the agent edits
is refused."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_stream.agents.calc import CALC_TOOL
from grpo_stream.agents.chat import (
    ChatFormat,
    Conversation,
    RequestError,
    assistant_message,
    new_messages,
    normalize,
)
from grpo_stream.agents.toolcalls import ToolCall, format_reply, parse_reply

USER = {"role": "user", "content": "37*48="}
CALL = ToolCall("calc", {"expr": "37*48"})


def conversation(
    fmt: ChatFormat, tok: Any, calls: list[ToolCall], ended: bool = True
) -> Conversation:
    reply = assistant_message(None, calls, [f"call_{i}" for i in range(len(calls))])
    return Conversation(tools=[CALC_TOOL], rendered=[USER, reply], visible=[0, 1],
                        last_end=tok.eos_token if ended else None)  # fmt: skip


def test_the_prompt_renders_the_tools_and_the_generation_prompt(tools_tokenizer: Any) -> None:
    fmt = ChatFormat(tools_tokenizer)
    ids = fmt.prompt([USER], [CALC_TOOL])
    assert tools_tokenizer.decode(ids) == "<bos>tool calc(expr)\nQ:37*48=\nA:"


def test_the_template_writes_calls_as_the_parser_reads_them(tools_tokenizer: Any) -> None:
    fmt = ChatFormat(tools_tokenizer)
    reply = assistant_message("ok", [CALL, ToolCall("calc", {"expr": "1"})], ["a", "b"])
    text = fmt.render([USER, reply], [CALC_TOOL], generation=False)
    written = text.split("A:", 1)[1].removesuffix("<eos>\n")
    assert written == format_reply("ok", reply_calls := [CALL, ToolCall("calc", {"expr": "1"})])
    assert parse_reply(written).calls == reply_calls


def test_a_tool_answer_is_what_follows_the_models_end_of_turn(tools_tokenizer: Any) -> None:
    fmt = ChatFormat(tools_tokenizer)
    conv = conversation(fmt, tools_tokenizer, [CALL])
    answer = {"role": "tool", "tool_call_id": "call_0", "content": "1776"}
    assert fmt.turn_text(conv, [answer]) == "\nR:1776\nA:"


def test_a_cut_reply_is_closed_by_the_end_of_turn_token_first(tools_tokenizer: Any) -> None:
    fmt = ChatFormat(tools_tokenizer)
    conv = conversation(fmt, tools_tokenizer, [CALL], ended=False)
    assert fmt.turn_text(conv, [{"role": "user", "content": "go"}]) == "<eos>\nQ:go\nA:"


def test_grouped_tool_answers_follow_the_im_end_the_model_sampled(hermes_tokenizer: Any) -> None:
    fmt = ChatFormat(hermes_tokenizer)
    conv = conversation(fmt, hermes_tokenizer, [CALL, CALL])
    answers = [{"role": "tool", "tool_call_id": f"call_{i}", "content": str(i)} for i in (1, 2)]
    assert fmt.turn_text(conv, answers) == (
        "\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    ids = fmt.turn(conv, answers)
    assert ids[1] == hermes_tokenizer.convert_tokens_to_ids("<|im_start|>")  # one token


NL = "{{- '\\n' -}}"
QWEN3_LIKE = (
    "{%- set ns = namespace(last=0) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}A:"
    "{{- m.content.split('</think>')[-1] if loop.index0 < ns.last else m.content -}}<eos>"
    + NL
    + "{%- else -%}Q:{{- m.content -}}"
    + NL
    + "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}A:{%- endif -%}"
)


def test_a_template_that_rewrites_history_is_read_after_a_stub(tools_tokenizer: Any) -> None:
    """Like Qwen3, which drops earlier reasoning once a new user turn comes: the history
    does not render incrementally, the next turn's text is the same."""
    tools_tokenizer.chat_template = QWEN3_LIKE
    fmt = ChatFormat(tools_tokenizer)
    reply = {"role": "assistant", "content": "<think>hm</think>42"}
    conv = Conversation(rendered=[USER, reply], visible=[0, 1], last_end="<eos>")
    assert fmt.turn_text(conv, [{"role": "user", "content": "sure?"}]) == "\nQ:sure?\nA:"


def test_a_template_that_never_renders_incrementally_is_refused(tools_tokenizer: Any) -> None:
    tools_tokenizer.chat_template = (
        "{{ messages | length }}{% for m in messages %}{{ m.content }}<eos>{% endfor %}"
    )
    fmt = ChatFormat(tools_tokenizer)
    conv = Conversation(rendered=[USER, {"role": "assistant", "content": "1"}], visible=[0, 1],
                        last_end="<eos>")  # fmt: skip
    with pytest.raises(RequestError, match="does not render this conversation incrementally"):
        fmt.turn_text(conv, [{"role": "user", "content": "2"}])


def test_a_tokenizer_without_template_is_one_line_naming_the_setting() -> None:
    from grpo_stream.builds.tiny import build_tokenizer

    with pytest.raises(ValueError, match=r"model\.name_or_path"):
        ChatFormat(build_tokenizer())


def test_messages_normalize_to_the_templates_shape() -> None:
    fn = {"name": "calc", "arguments": '{"expr": "1"}'}
    echoed = {"role": "assistant", "content": None, "refusal": None, "audio": None,
              "tool_calls": [{"id": "c", "type": "function", "function": fn}]}  # fmt: skip
    assert normalize(echoed, 1) == assistant_message(None, [ToolCall("calc", {"expr": "1"})], ["c"])
    texts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    parts = {"role": "developer", "content": texts}
    assert normalize(parts, 0) == {"role": "system", "content": "ab"}
    with pytest.raises(RequestError, match=r"messages\[2\].role"):
        normalize({"role": "robot", "content": "x"}, 2)
    with pytest.raises(RequestError, match="only text content"):
        normalize({"role": "user", "content": [{"type": "image_url"}]}, 0)
    bad = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}
    with pytest.raises(RequestError, match="not JSON"):
        normalize(bad, 3)


def test_a_request_must_extend_what_the_agent_was_shown(tools_tokenizer: Any) -> None:
    fmt = ChatFormat(tools_tokenizer)
    conv = conversation(fmt, tools_tokenizer, [CALL])
    shown = conv.shown()
    answer = {"role": "tool", "tool_call_id": "call_0", "content": "1776"}
    assert new_messages(conv, [*shown, answer]) == [answer]
    edited = [shown[0], {**shown[1], "content": "I will cheat"}, answer]
    with pytest.raises(RequestError, match=r"messages\[1\] \(assistant\) differs"):
        new_messages(conv, edited)
    with pytest.raises(RequestError, match="fewer than"):
        new_messages(conv, shown[:1])


def test_a_template_that_fails_on_a_request_is_a_400_naming_it(tools_tokenizer: Any) -> None:
    from grpo_stream.agents.episode import AgentEpisode, prepare_chat
    from grpo_stream.agents.openai_api import ApiError, ChatRequest
    from grpo_stream.envs.episodes import Episode

    fmt = ChatFormat(tools_tokenizer)
    ep = AgentEpisode(key=0, secret="s", task={}, traj=Episode(prompt_ids=[]))
    bare_tool = {"type": "function", "function": {"name": "f"}}  # no parameters to list
    req = ChatRequest.model_validate({"messages": [USER], "tools": [bare_tool]})
    with pytest.raises(ApiError, match="the chat template cannot render this request"):
        prepare_chat(ep, req, fmt, "k")


def test_the_rendering_a_reply_followed_spares_a_render_and_changes_nothing(
    hermes_tokenizer: Any,
) -> None:
    fmt = ChatFormat(hermes_tokenizer)
    conv = conversation(fmt, hermes_tokenizer, [CALL])
    answer = [{"role": "tool", "tool_call_id": "call_0", "content": "1776"}]
    fresh, head = fmt.next_turn(conv, answer)
    conv.head = fmt.render([USER], [CALC_TOOL], generation=True)
    assert fmt.next_turn(conv, answer) == (fresh, head)
    assert head == fmt.render([*conv.rendered, *answer], [CALC_TOOL], generation=True)
