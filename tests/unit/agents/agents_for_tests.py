"""Agents the endpoint tests run in the real agent sandbox; `dispatch` picks one by the task's
reference["do"], so one pool serves every test. An agent checks what it is answered with
`expect` (a failed check fails its episode with the reason)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from grpo_stream.agents.calc import CALC_TOOL

USER = {"role": "user", "content": "3+4="}


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


async def ask(client: Any, messages: list[Any], **kw: Any) -> Any:
    kw.setdefault("tools", [CALC_TOOL])
    return await client.chat.completions.create(model="policy", messages=messages, **kw)


async def calls_then_answers(client: Any, task: dict[str, Any]) -> float:
    """The calc agent's loop, checking the reply's shape on the way."""
    messages: list[Any] = [USER]
    for turn in range(8):
        choice = (await ask(client, messages)).choices[0]
        messages.append(choice.message)
        if not choice.message.tool_calls:
            expect(choice.finish_reason in ("stop", "length"), f"finish {choice.finish_reason}")
            return float(turn)
        expect(choice.finish_reason == "tool_calls", f"finish {choice.finish_reason}")
        for call in choice.message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": args["expr"]})
    return -1.0


async def until_length(client: Any, task: dict[str, Any]) -> float:
    """Asks until the endpoint says the budget is spent; returns the replies it got."""
    messages: list[Any] = [USER]
    for turn in range(20):
        choice = (await ask(client, messages)).choices[0]
        if choice.finish_reason == "length" and not choice.message.content:
            return float(turn)
        messages.append(choice.message)
        messages.append({"role": "user", "content": "again"})
    return -1.0


async def edits_history(client: Any, task: dict[str, Any]) -> float:
    await ask(client, [USER])
    edited = {"role": "assistant", "content": "something else"}
    await ask(client, [USER, edited, {"role": "user", "content": "and?"}])
    return 1.0


async def raises(client: Any, task: dict[str, Any]) -> float:
    await ask(client, [USER])
    raise ValueError("the agent broke")


async def hangs(client: Any, task: dict[str, Any]) -> float:
    await ask(client, [USER])
    await asyncio.sleep(3600)
    return 1.0


async def spins(client: Any, task: dict[str, Any]) -> float:
    await ask(client, [USER])
    while True:
        pass


async def hogs(client: Any, task: dict[str, Any]) -> float:
    await ask(client, [USER])
    blocks = [bytearray(64 * 2**20) for _ in range(64)]
    return float(len(blocks))


async def returns_text(client: Any, task: dict[str, Any]) -> Any:
    await ask(client, [USER])
    return "1.0"


async def never_asks(client: Any, task: dict[str, Any]) -> float:
    return 1.0


async def twice_at_once(client: Any, task: dict[str, Any]) -> float:
    """Two requests at once (the model is slow): the second is refused, in flight."""
    other = {"role": "user", "content": "4+4="}
    got = await asyncio.gather(ask(client, [USER]), ask(client, [other]), return_exceptions=True)
    statuses = sorted(getattr(g, "status_code", 200) for g in got)
    expect(statuses == [200, 409], f"statuses {statuses}")
    return 1.0


async def retries_a_lost_reply(client: Any, task: dict[str, Any]) -> float:
    first = await ask(client, [USER])
    again = await ask(client, [USER])  # the same body: a client retrying
    expect(first.id == again.id, f"{first.id} != {again.id}")
    expect(first.choices[0].message == again.choices[0].message, "other reply")
    return 1.0


async def refused_fields(client: Any, task: dict[str, Any]) -> float:
    import openai

    unknown = {"type": "function", "function": {"name": "nope"}}
    for kw in ({"n": 2}, {"stream": True}, {"tool_choice": unknown}):
        try:
            await ask(client, [USER], **kw)
        except openai.BadRequestError:
            continue
        raise AssertionError(f"{kw} was accepted")
    await ask(client, [USER], temperature=0.3)  # served under the run's sampling, counted
    return 1.0


async def choice_none_and_forced(client: Any, task: dict[str, Any]) -> float:
    """tool_choice none: the reply is content even when it writes a call; a named choice
    puts the call's opening after the generation prompt."""
    first = (await ask(client, [USER], tool_choice="none")).choices[0]
    expect(not first.message.tool_calls, "a call under tool_choice none")
    messages = [USER, first.message, {"role": "user", "content": "use it"}]
    named = {"type": "function", "function": {"name": "calc"}}
    second = (await ask(client, messages, tool_choice=named)).choices[0]
    expect(second.finish_reason == "tool_calls", f"finish {second.finish_reason}")
    return 1.0


async def raw_http(client: Any, task: dict[str, Any]) -> float:
    """Plain httpx at the episode's base URL: /v1/models, /v1/completions with text."""
    async with httpx.AsyncClient(base_url=str(client.base_url), timeout=None) as http:
        models = (await http.get("/models")).json()
        expect(models["data"][0]["object"] == "model", f"{models}")
        first = (await http.post("/completions", json={"prompt": "3+4=", "logprobs": 1})).json()
        text = first["choices"][0]["text"]
        expect(len(first["choices"][0]["logprobs"]["token_logprobs"]) > 0, f"{first}")
        second = await http.post("/completions", json={"prompt": "3+4=" + text + " ok"})
        expect(second.status_code == 200, second.text)
        bad = await http.post("/completions", json={"prompt": "other"})
        expect(bad.status_code == 400, bad.text)
        chat = await http.post("/chat/completions", json={"messages": [USER]})
        expect(chat.status_code == 400 and "one kind" in chat.text, chat.text)
    return 1.0


async def dispatch(client: Any, task: dict[str, Any]) -> Any:
    return await globals()[task["reference"]["do"]](client, task)


async def three_tool_turns(client: Any, task: dict[str, Any]) -> float:
    """A reply that must call a tool (tool_choice required), answered by tool messages, a
    reply that may not call (tool_choice none), then a second question (12+5=) answered
    without tools: three policy turns. Returns the well-formed calls plus the replies that
    stopped (3.0: all went well); returns early when the budget is spent."""
    messages: list[Any] = [{"role": "user", "content": task["prompt"]}]
    choice = (await ask(client, messages, tool_choice="required", logprobs=True)).choices[0]
    messages.append(choice.message)
    score = 0.0
    for call in choice.message.tool_calls or []:
        score += 1
        args = json.loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": str(args.get("expr", ""))[:8]})  # fmt: skip
    for question in (None, "12+5="):
        if question:
            messages.append({"role": "user", "content": question})
        last = (await ask(client, messages, tool_choice="none")).choices[0]
        expect(not last.message.tool_calls, "a call under tool_choice none")
        if last.finish_reason == "length":
            return score
        messages.append(last.message)
        score += last.finish_reason == "stop"
    return score


async def token_ids_in_and_out(client: Any, task: dict[str, Any]) -> float:
    """/v1/completions in token ids: each prompt is the ids returned so far plus new ones."""
    async with httpx.AsyncClient(base_url=str(client.base_url), timeout=None) as http:
        body = {"prompt": [1, 22, 15, 23, 62], "return_token_ids": True}
        first = (await http.post("/completions", json=body)).json()
        held = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
        expect(held[:5] == [1, 22, 15, 23, 62], f"{first}")
        second = await http.post("/completions", json={"prompt": [*held, 22, 15],
                                                      "return_token_ids": True})  # fmt: skip
        expect(second.status_code == 200, second.text)
        seen = second.json()["prompt_token_ids"]
        expect(seen == [*held, 22, 15], f"{seen} != {held} + [22, 15]")
        usage = second.json()["usage"]["prompt_tokens"]
        expect(usage == len(seen), f"usage {usage}")
        bad = await http.post("/completions", json={"prompt": [*held, 10**6]})
        expect(bad.status_code == 400, bad.text)
    return 1.0
