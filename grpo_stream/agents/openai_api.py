"""The OpenAI wire shapes the endpoint reads and writes (`/v1/chat/completions`,
`/v1/completions`, `/v1/models`): request validation and response bodies, nothing else.

What is honoured, and what is refused rather than silently ignored:
- one choice (`n` = 1), no streaming, no `echo`: each refused with a 400 naming the field;
- `max_tokens` / `max_completion_tokens` cap the reply below generator.max_tokens and the
  episode's room; `logprobs` returns the behaviour log-prob of every sampled token;
  `return_token_ids` (vLLM's extension) returns the ids the model saw and sampled;
- `temperature`, `top_p`, `seed`, `stop`, penalties: sampling is the run's
  (generator.temperature, generator.top_p), because the trainer's importance weights assume
  it; a request asking otherwise is served under the run's sampling and counted
  (`sampling_overridden` in the generator's stats), never trained on a distribution the
  trainer does not know.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpo_stream.agents.toolcalls import ToolCall

FinishReason = Literal["stop", "length", "tool_calls"]
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
)


class ApiError(Exception):
    """An HTTP error answer: status and message (OpenAI's error body)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "code": self.status}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")  # user, metadata, store...: not ours to refuse

    model: str = "policy"
    max_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=1)
    stream: Literal[False] = False
    return_token_ids: bool = False
    """vLLM's extension: the reply carries `prompt_token_ids` (everything the model saw) and
    `choices[0].token_ids` (what it sampled), for agents that work in token ids."""

    def overrides(self, temperature: float, top_p: float) -> list[str]:
        """The sampling fields the request sets to something other than the run's."""
        out = []
        extra = self.model_extra or {}
        for name in SAMPLING_FIELDS:
            value = extra.get(name)
            if value is None:
                continue
            if (name == "temperature" and value == temperature) or (
                name == "top_p" and value == top_p
            ):
                continue
            out.append(name)
        return out


class ChatRequest(_Request):
    """A `/v1/chat/completions` body."""

    messages: list[Any] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    parallel_tool_calls: bool = True

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def tool_names(self) -> list[str]:
        names = []
        for i, tool in enumerate(self.tools or []):
            fn = tool.get("function")
            if tool.get("type", "function") != "function" or not isinstance(fn, dict):
                raise ApiError(400, f"tools[{i}] must be a function tool")
            if not isinstance(fn.get("name"), str) or not fn["name"]:
                raise ApiError(400, f"tools[{i}].function.name is missing")
            names.append(fn["name"])
        return names

    def choice(self) -> tuple[bool, str | None]:
        """(parse calls, the one tool a call must name) from tool_choice: none -> no calls;
        auto or unset -> calls when tools are offered; required -> a call forced;
        {"type": "function", "function": {"name": N}} -> a call to N forced."""
        names = self.tool_names()
        choice = self.tool_choice
        if choice is None or choice == "auto":
            return bool(names), None
        if choice == "none":
            return False, None
        if not names:
            raise ApiError(400, "tool_choice needs tools")
        if choice == "required":
            return True, ""
        fn = choice.get("function") if isinstance(choice, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in names:
            raise ApiError(400, f"tool_choice names no offered tool: {choice!r}")
        return True, str(name)


class CompletionRequest(_Request):
    """A `/v1/completions` body."""

    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=5)
    """Any number returns the sampled tokens' log-probs (no alternatives)."""
    echo: Literal[False] = False


def parse(model: type[_Request], body: Any) -> Any:
    """The validated request, or a 400 naming the first bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(400, f"{where}: {first['msg']}") from None


def chat_response(
    rid: str,
    model: str,
    content: str | None,
    calls: list[ToolCall],
    call_ids: list[str],
    finish: FinishReason,
    usage: tuple[int, int],
    logprobs: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """A `chat.completion` body with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {
                "id": i,
                "type": "function",
                "function": {"name": c.name, "arguments": _json(c.arguments)},
            }
            for c, i in zip(calls, call_ids, strict=True)
        ]
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": finish,
        "logprobs": None if logprobs is None else {"content": logprobs},
    }
    return _envelope(rid, "chat.completion", model, choice, usage)


def completion_response(
    rid: str,
    model: str,
    text: str,
    finish: FinishReason,
    usage: tuple[int, int],
    logprobs: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """A `text_completion` body with one choice."""
    lp = None
    if logprobs is not None:
        lp = {
            "tokens": [x["token"] for x in logprobs],
            "token_logprobs": [x["logprob"] for x in logprobs],
            "top_logprobs": None,
            "text_offset": None,
        }
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": lp}
    return _envelope(rid, "text_completion", model, choice, usage)


def token_logprobs(pieces: list[str], logprobs: list[float]) -> list[dict[str, Any]]:
    """OpenAI's per-token log-prob entries of a reply."""
    return [
        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
        for t, lp in zip(pieces, logprobs, strict=True)
    ]


def models_response(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "grpo-stream"}]}


def _envelope(
    rid: str, kind: str, model: str, choice: dict[str, Any], usage: tuple[int, int]
) -> dict[str, Any]:
    prompt, completion = usage
    return {
        "id": rid,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False)
