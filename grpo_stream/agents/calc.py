"""The shipped tool example: calc problems solved with a calculator called as a JSON function.

The task is `calc` (`a op b =`, a, b <= 99, op in + - *). The model is offered one tool,

    calc(expr: string) -> the value of an arithmetic expression (`grpo_stream.envs.calc`),

and calls it through its chat template's function-call format (`<tool_call>{"name": "calc",
"arguments": {"expr": "37*48"}}</tool_call>`, `grpo_stream.agents.toolcalls`). A reply
without a call is the final answer: its last integer, reward 1 when right, else 0.

Played two ways, with the same rules and the same parser:
- `calc_agent`: user code as users write it, an async function given an OpenAI client and a
  task row (`env.agent = "grpo_stream.agents.calc:calc_agent"`); it runs in the agent
  sandbox and talks to the generator's endpoint over HTTP;
- `CalcToolsEnv`: the same game as an in-process environment (`grpo_stream.envs.base`) for
  the turn loop the endpoint is measured against (bench/agents.py), with the tool's answer
  rendered as the template's tool message (`TurnFormat(role="tool")`).
"""

from __future__ import annotations

import json
from typing import Any

from grpo_stream.agents.toolcalls import ToolCall, parse_reply, unknown_tool
from grpo_stream.envs.base import Step
from grpo_stream.envs.calc import calculate, final_answer

CALC_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expr": {"type": "string", "description": "e.g. 37*48"}},
            "required": ["expr"],
        },
    },
}
MAX_REPLIES = 8
"""The agent's own bound on replies (the endpoint's env.max_turns ends episodes first)."""


def run_tool(call: ToolCall) -> str:
    """What the calc tool answers to one call (an `error: ...` text for bad arguments)."""
    expr = call.arguments.get("expr")
    if not isinstance(expr, str):
        return "error: calc needs a string argument expr"
    return calculate(expr)


def reward(reply: str | None, task: dict[str, Any]) -> float:
    """1.0 when the final reply's last integer is the problem's answer, else 0.0."""
    return 1.0 if final_answer(reply or "") == int(task["reference"]["answer"]) else 0.0


async def calc_agent(client: Any, task: dict[str, Any]) -> float:
    """Solve one calc problem with the calc tool through an OpenAI-compatible client."""
    messages: list[Any] = [{"role": "user", "content": task["prompt"]}]
    for _ in range(MAX_REPLIES):
        response = await client.chat.completions.create(
            model="policy", messages=messages, tools=[CALC_TOOL]
        )
        choice = response.choices[0]
        messages.append(choice.message)
        if choice.finish_reason == "length":
            return 0.0  # the episode's budget ran out
        if not choice.message.tool_calls:
            return reward(choice.message.content, task)
        for call in choice.message.tool_calls:
            args = json.loads(call.function.arguments)
            answer = run_tool(ToolCall(call.function.name, args))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
    return 0.0


class CalcToolsEnv:
    """The calc-tools game as an in-process environment (the same rules as `calc_agent`,
    malformed calls answered with an error the way the endpoint answers them)."""

    def __init__(self, turns: int = 3) -> None:
        self.turns = turns
        self.turn = 0
        self.task: dict[str, Any] = {}

    def reset(self, prompt: str, reference: dict[str, Any]) -> None:
        self.task = {"prompt": prompt, "reference": reference}
        self.turn = 0

    def step(self, action: str) -> Step:
        self.turn += 1
        last = self.turn >= self.turns
        parsed = parse_reply(action)
        bad = parsed.malformed or unknown_tool(parsed.calls, ["calc"])
        if bad is not None:
            return Step(f"error: {bad}", 0.0, last)
        if parsed.calls:
            return Step("\n".join(run_tool(c) for c in parsed.calls), 0.0, last)
        return Step("", reward(parsed.content, self.task), True)
