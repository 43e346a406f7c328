"""An agent as user code: how it is loaded, and what it is given to reach the model when
`env.agent_client = "endpoint"`."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

AgentFn = Callable[[Any, dict[str, Any]], Any]
"""`async def agent(client, task) -> float`."""


@dataclass(frozen=True)
class Endpoint:
    """One episode's OpenAI-compatible endpoint, for any client (httpx, requests, a
    framework's own): POST `{base_url}/chat/completions` or `{base_url}/completions`.

    Send each request once: a client that retries on its own must be told not to (a retried
    request whose reply was lost is answered from the endpoint's copy, but a retry with a
    changed body is a new turn)."""

    base_url: str
    api_key: str
    model: str = "policy"


def load_agent(spec: str) -> AgentFn:
    """The agent function `package.module:function` (ValueError naming env.agent)."""
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"env.agent = {spec!r} does not load: {exc}") from None
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"env.agent = {spec!r} is not an async function (async def)")
    return fn  # type: ignore[no-any-return]
