"""A verifiers episode (`verifiers.v1.Env`) played as a grpo-stream environment.

verifiers 0.4 writes an environment as a coroutine, `Env.run(task, agents)`, that drives its
policy seat turn by turn (`async with agents.<seat>.interaction(task) as it:
segment = await it.turn(); ...; segment = await it.turn(feedback)`), and scores the seat's
trace with the task's `@vf.reward` hooks plus whatever `run()` / `finalize()` record. Here
the seat is a stand-in whose `turn(message)` suspends the coroutine and hands `message` to
grpo-stream's turn loop as the environment's observation; the next `step(action)` resumes it
with the policy's reply. So verifiers never calls a model: our engine samples every reply
from exact token ids (`grpo_stream.envs.episodes`), nothing is sent over HTTP, nothing is
re-tokenized.

Per episode (inside a sandboxed env worker, `grpo_stream.envs.sandbox`):

    reset  -> setup(agents); run(task, agents) until its first bare turn()
    step   -> the reply resumes run(); it asks again: Step(observation, 0, done=False)
                                      it returns:    finalize(); Step("", reward, done=True)

Invariants:
- the episode's reward is the seat's `trace.reward` after `run()` and `finalize()` (the
  weighted sum of its named rewards: the task's `@vf.reward` hooks, scored when the
  interaction closes, plus the env's `trace.record_reward`), all on the last turn;
- the task's `@vf.stop` hooks on the trace are checked before each later turn; one that
  fires ends the exchange the way verifiers does (that `turn()` comes back `terminated`);
- anything the env raises (including verifiers' own misuse errors: a prompted task opened
  with a message, a turn after the exchange ended) fails the episode: NaN, one error line;
- what the stand-in does not do raises too (so the episode fails rather than silently
  differs): tools, MCP toolsets, borrowed runtimes, steering, several seats, LLM judges.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.configs.agent import agent_config_fields
from verifiers.v1.session import call_hook, hook_boundary
from verifiers.v1.types import content_text

from grpo_stream.envs.base import Step
from grpo_stream.tasks.verifiers import load_vf_env, rebuild_task


@functools.cache
def _loop() -> asyncio.AbstractEventLoop:
    """One event loop per worker process; every episode's coroutine runs on it."""
    return asyncio.new_event_loop()


class _Bridge:
    """Where the env's coroutine and the turn loop meet: `ask` resolves with the env's
    message when it wants a reply, `reply` with the policy's answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ask: asyncio.Future[str | None] = loop.create_future()
        self.reply: asyncio.Future[str] | None = None

    async def exchange(self, message: str | None) -> str:
        self.reply = self.loop.create_future()
        self.ask.set_result(message)
        return await self.reply


class _Exchange:
    """Stands in for `vf.Interaction`: the trace, turn(), close()."""

    def __init__(self, seat: _Seat, task: Any) -> None:
        self.seat, self.task = seat, task
        info = vf.AgentInfo(config=seat.config, name=seat.name, trainable=seat.trainable)
        kind = type(task).__name__
        record = vf.TraceTask(type=kind, data=task.data, key=task.key, hash=task.hash)
        self.trace = vf.Trace(task=record, agent=info)
        self._stops = task.hooks("stop")
        if not all(_trace_hook(fn) for fn in self._stops):
            raise NotImplementedError("@stop hooks on a request or response are not supported")
        self._started = self._over = self._closed = False
        if task.data.system_prompt:
            self._add(vf.SystemMessage(content=task.data.system_prompt), sampled=False)
        prompt = task.data.prompt
        for message in [vf.UserMessage(content=prompt)] if isinstance(prompt, str) else prompt:
            self._add(message, sampled=False)

    def _add(self, message: Any, sampled: bool) -> None:
        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(vf.MessageNode(parent=parent, message=message, sampled=sampled))

    async def turn(self, message: str | list[Any] | None = None) -> vf.Segment:
        if self._over or self._closed:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        if not self._started and message is not None:
            raise ValueError(
                "the task's prompt opens this exchange: take its first reply with a bare turn()"
            )
        if self._started and message is None:
            raise ValueError("nothing to run a turn on: this exchange takes the next user message")
        if self._started and await self._stopped():
            self._over = True
            return vf.Segment(messages=[], terminated=True)
        text = None if message is None else _text(message)
        if text is not None:
            self._add(vf.UserMessage(content=text), sampled=False)
        self._started = True
        reply = vf.AssistantMessage(content=await self.seat.bridge.exchange(text))
        self._add(reply, sampled=True)
        return vf.Segment(messages=[reply])

    async def _stopped(self) -> bool:
        for fn in self._stops:
            fired = await call_hook(fn, {vf.Trace: self.trace})
            if not isinstance(fired, bool):
                raise TypeError(f"@stop {fn.__name__} returned {type(fired).__name__}, not bool")
            if fired:
                self.trace.stop(fn.__name__)
                return True
        return False

    async def close(self) -> vf.Trace:
        """End the exchange and score the trace with the task's rewards (idempotent)."""
        if not self._closed:
            self._closed = True
            self.trace.stop("user_closed")
            if self.task.config.judges:
                raise NotImplementedError("LLM judges are not supported (no model client)")
            await self.task.score(self.trace)
            self.trace.ok = True
        return self.trace

    async def steer(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("steering an interaction is not supported")


class _Seat:
    """Stands in for the env's one `vf.Agent`: interaction() and run()."""

    def __init__(self, name: str, config: Any, bridge: _Bridge) -> None:
        self.name, self.config, self.bridge = name, config, bridge
        self.trainable = True
        self.exchange: _Exchange | None = None

    @asynccontextmanager
    async def interaction(self, task: Any) -> AsyncIterator[_Exchange]:
        if self.exchange is not None:
            raise NotImplementedError("one interaction per episode (its trace is the episode)")
        if type(task).toolsets(task.config):
            raise NotImplementedError("tasks with tool servers are not supported")
        self.exchange = _Exchange(self, task)
        try:
            yield self.exchange
        finally:
            await self.exchange.close()

    async def run(self, task: Any) -> vf.Trace:
        """One segment: the policy's reply to the task's prompt."""
        async with self.interaction(task) as exchange:
            await exchange.turn()
        return exchange.trace


class _Agents:
    """Stands in for `vf.Agents`: the seat by attribute."""

    def __init__(self, seat: _Seat) -> None:
        self._seat = seat

    def __getattr__(self, name: str) -> _Seat:
        seat: _Seat | None = self.__dict__.get("_seat")
        if seat is None or name != seat.name:
            raise AttributeError(f"no agent {name!r}; this env's seat is {seat and seat.name!r}")
        return seat


class VerifiersEnv:
    """grpo-stream's `Environment` playing one verifiers episode (see the module doc)."""

    def __init__(self) -> None:
        self._runner: asyncio.Task[float] | None = None
        self._bridge: _Bridge | None = None

    def reset(self, prompt: str, reference: dict[str, Any]) -> None:
        env = load_vf_env(str(reference["vf_env"]))
        task = rebuild_task(env, reference["vf_task"])
        ((name, config),) = agent_config_fields(env.config).items()
        self._bridge = _Bridge(_loop())
        seat = _Seat(name, config, self._bridge)
        self._runner = _loop().create_task(_play(env, task, seat))
        first = self._advance()
        if first.done:
            raise RuntimeError(f"{type(env).__name__}.run() ended before the policy's first turn")

    def step(self, action: str) -> Step:
        if self._bridge is None or self._bridge.reply is None:
            raise RuntimeError("step() before reset()")
        self._bridge.reply.set_result(action)
        return self._advance()

    def _advance(self) -> Step:
        """Run the env's coroutine until it asks for a reply or ends."""
        if self._bridge is None or self._runner is None:
            raise RuntimeError("the episode was not reset")
        ask = self._bridge.ask
        either: list[asyncio.Future[Any]] = [self._runner, ask]
        _loop().run_until_complete(asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED))
        if ask.done():
            self._bridge.ask = _loop().create_future()
            return Step(ask.result() or "", 0.0, False)
        return Step("", float(self._runner.result()), True)

    def __del__(self) -> None:
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()  # dropped mid-episode (truncated, or the worker stops)


async def _play(env: Any, task: Any, seat: _Seat) -> float:
    """setup, run, finalize: the episode's reward is its seat's trace reward."""
    agents = _Agents(seat)
    await env.setup(agents)
    await env.run(task, agents)
    if seat.exchange is None:
        raise RuntimeError(f"{type(env).__name__}.run() ran no agent")
    trace = seat.exchange.trace
    episode = vf.Episode(env=vf.EnvInfo(id=env.config.env_id), task=trace.task, traces=[trace])
    await env.finalize(task, episode)
    return float(trace.reward)


def _trace_hook(fn: Any) -> bool:
    """Whether a @stop hook reads the trace (request/response hooks need a model client)."""
    try:
        return hook_boundary(fn, allow_trace=True) is vf.Trace
    except TypeError:
        return False


def _text(message: str | list[Any]) -> str:
    if isinstance(message, str):
        return message
    parts = [content_text(m["content"] if isinstance(m, dict) else m.content) for m in message]
    return "\n\n".join(p for p in parts if p)
