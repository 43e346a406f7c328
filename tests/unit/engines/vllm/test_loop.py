"""The vllm engine's event loop: one request, one Finished in its sink, vLLM replaced at its
boundary by an object whose `generate` is an async generator (as AsyncLLM's is)."""

from __future__ import annotations

import queue
from collections.abc import AsyncIterator
from typing import Any

from grpo_stream.engines.vllm.loop import Finished, Loop, Request


class FakeLLM:
    """AsyncLLM's `generate` surface: yields outputs, the last one final."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[str]:
        self.calls.append((args, kwargs))
        if self.fail:
            raise RuntimeError("engine core died")
        yield "partial"
        yield "final"


def test_a_request_ends_once_in_its_sink_with_the_final_output_and_its_tag() -> None:
    loop, llm = Loop(), FakeLLM()
    sink: queue.Queue[Finished] = queue.Queue()
    try:
        loop.request(llm, Request("r-1", "key", ("prompt", "params"), {"lora": None}, sink, 7))
        done = sink.get(timeout=10)
    finally:
        loop.close()
    assert (done.key, done.output, done.error, done.tag) == ("key", "final", None, 7)
    assert llm.calls == [(("prompt", "params"), {"request_id": "r-1", "lora": None})]
    assert loop.requests == {} and sink.empty()


def test_a_request_the_engine_fails_ends_with_its_error() -> None:
    loop = Loop()
    sink: queue.Queue[Finished] = queue.Queue()
    try:
        loop.request(FakeLLM(fail=True), Request("r-2", 5, (), {}, sink))
        done = sink.get(timeout=10)
    finally:
        loop.close()
    assert done.key == 5 and done.output is None
    assert isinstance(done.error, RuntimeError) and "engine core died" in str(done.error)
    assert loop.requests == {}
