"""The worker side of the agent sandbox: a process running user agents on an event loop.

Runs in a sandbox worker (`grpo_stream.sandbox.worker.serve`: forked from the fork server,
SIGINT ignored, death with its parent, address space capped at its size after loading plus
env.memory_limit_mb). Loading imports the agent function and
the client library. Messages (msgpack):

    parent -> worker  ["run", [[key, base_url, task], ...], cpu_seconds]   a batch
                      ["cancel", [key, ...], cause]
                      ["stop"]
    worker -> parent  ["done", key, reward] | ["error", key, cause]        one per key

Agents run concurrently on the worker's one event loop, each given its own client of its
episode's URL; while any runs, the loop reads the pipe itself (a message is never lost
between a batch's last result and the loop's return); the process's CPU time limit
(RLIMIT_CPU) is raised by `cpu_seconds` for each batch, past which the kernel stops the
worker (SIGXCPU). An agent's reward must be a finite
real number; anything it raises, or a cancel, is its error line.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import numbers
import resource
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from grpo_stream.agents.client import AgentFn, Endpoint, load_agent
from grpo_stream.agents.openai_api import chat_response, completion_response, token_logprobs
from grpo_stream.agents.toolcalls import ToolCall
from grpo_stream.sandbox.worker import Handler, pack, short, unpack

API_KEY = "grpo-stream"
"""What clients send as their key (the episode's secret is in its URL)."""


def client_factory(kind: str) -> Callable[[str], Any]:
    """Builds each episode's client: an `openai.AsyncOpenAI` (no retries: a retried request
    would be a new turn; no timeout: the endpoint answers or the worker dies with the
    generator), or an `Endpoint` for any other client."""
    if kind == "endpoint":
        return lambda url: Endpoint(base_url=url, api_key=API_KEY)
    import httpx  # the client libraries load in the worker only
    import openai

    shared = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=1024))

    def build(url: str, http: Any = shared) -> Any:
        return openai.AsyncOpenAI(base_url=url, api_key=API_KEY, max_retries=0, http_client=http)

    # A client's first calls import and build its types (seconds of CPU on a busy host): make
    # them at load, against canned replies, not in an agent's timed first turn.
    canned = httpx.MockTransport(lambda request: httpx.Response(200, json=_canned(request.url)))
    warm = build("http://warm-up/v1", httpx.AsyncClient(transport=canned))
    asyncio.run(_warm_up(warm))
    return build


def _canned(url: Any) -> dict[str, Any]:
    calls = [ToolCall("f", {"x": 1})]
    if str(url).endswith("/chat/completions"):
        lps = token_logprobs(["a"], [-0.5])
        return chat_response("w", "policy", None, calls, ["c"], "tool_calls", (1, 1), lps)
    return completion_response("w", "policy", "a", "stop", (1, 1), token_logprobs(["a"], [-0.5]))


async def _warm_up(client: Any) -> None:
    messages = [{"role": "user", "content": "u"}]
    reply = await client.chat.completions.create(model="policy", messages=messages, logprobs=True)
    messages.append(reply.choices[0].message)
    await client.chat.completions.create(model="policy", messages=messages)
    await client.completions.create(model="policy", prompt="p", logprobs=1)


def check_reward(value: object) -> tuple[float | None, str | None]:
    """(reward, None) for a finite real number, else (None, why)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return None, f"agent returned {type(value).__name__}, not a number"
    number = float(value)
    if not math.isfinite(number):
        return None, f"agent returned non-finite reward {number}"
    return number, None


class Runner:
    """The worker's agents on its one event loop. While agents run, the loop itself reads
    the pipe (a cancel, the next batch, stop), so no message is read by anyone else then."""

    def __init__(
        self,
        conn: Connection,
        fn: AgentFn,
        client: Callable[[str], Any],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.conn, self.fn, self.client, self.loop = conn, fn, client, loop
        self.tasks: dict[int, asyncio.Task[Any]] = {}
        self.cancelled: dict[int, str] = {}
        self.stopping = False

    def handle(self, message: list[Any]) -> None:
        """A message `serve` read between batches: run until every agent has ended."""
        self._dispatch(message)
        if not self.tasks:
            return
        self.loop.add_reader(self.conn.fileno(), self._read)
        try:
            while self.tasks:
                self.loop.run_until_complete(asyncio.wait(list(self.tasks.values())))
        finally:
            self.loop.remove_reader(self.conn.fileno())
        if self.stopping:
            raise SystemExit(0)

    def _read(self) -> None:
        try:
            message = unpack(self.conn.recv_bytes())
        except (EOFError, OSError):
            message = ["stop"]
        self._dispatch(message)

    def _dispatch(self, message: list[Any]) -> None:
        if message[0] == "run":
            self._start(message[1], float(message[2]))
        elif message[0] == "cancel":
            self._cancel([int(k) for k in message[1]], str(message[2]))
        elif message[0] == "stop":
            self.stopping = True
            self._cancel(list(self.tasks), "the generator stopped")

    def _start(self, jobs: list[list[Any]], cpu_s: float) -> None:
        _raise_cpu_limit(cpu_s)
        for key, url, task in jobs:
            t = self.loop.create_task(self.fn(self.client(url), task))
            t.add_done_callback(functools.partial(self._report, int(key)))
            self.tasks[int(key)] = t

    def _cancel(self, keys: list[int], cause: str) -> None:
        for key in keys:
            task = self.tasks.get(key)
            if task is not None and not task.done():
                self.cancelled[key] = cause
                task.cancel()

    def _report(self, key: int, task: asyncio.Task[Any]) -> None:
        self.tasks.pop(key, None)
        if task.cancelled():
            reply = ["error", key, self.cancelled.pop(key, "agent cancelled")]
        elif (exc := task.exception()) is not None:
            cause = (
                "memory limit"
                if isinstance(exc, MemoryError)
                else (f"agent raised {type(exc).__name__}: {exc}")
            )
            reply = ["error", key, short(cause)]
        else:
            reward, why = check_reward(task.result())
            reply = ["done", key, reward] if why is None else ["error", key, why]
        with contextlib.suppress(OSError):
            self.conn.send_bytes(pack(reply))


def _raise_cpu_limit(seconds: float) -> None:
    """Let this process use `seconds` more CPU time (then SIGXCPU stops it)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = used.ru_utime + used.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    limit = math.ceil(spent + seconds)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (limit, hard))


def load(conn: Connection, settings: dict[str, Any]) -> Handler:
    """An agent worker's code (`grpo_stream.sandbox.worker.serve` calls it): the agent and
    its client library, and the handler that runs batches."""
    fn = load_agent(str(settings["agent"]))
    client = client_factory(str(settings["agent_client"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a SIGXCPU death writes no core
    return Runner(conn, fn, client, asyncio.new_event_loop()).handle
