"""The generator's side of agent episodes: a PromptBatch played by user agents.

`AgentPlayer` owns, for the life of the generator, the OpenAI-compatible endpoint (a uvicorn
thread), the agent workers (`AgentPool`) and the chat format. `play` gives each episode
(G per prompt) a secret URL, starts its agent with the task row, and serves the agents'
requests in batches (`Batcher`) until every agent has returned, failed or been stopped:

    launch the agents
    until every agent has ended:
        wait for requests, results, or the next deadline
        an agent returned    -> its reward goes on the last policy turn; the episode ends
        an agent failed      -> NaN reward, its error recorded and counted
        an agent over time   -> cancelled; the episode fails
        every agent still talking waits for the model, or no request came for
            env.batch_wait_s -> sample the waiting requests as one batch

The episodes then become Rollouts exactly like environment episodes
(`grpo_stream.envs.service.episode_rollout`), after `align_prompts` gives the G episodes of
a prompt one shared prompt (their first requests' longest common prefix; what follows it in
an episode is kept as template tokens, mask 0).

Invariants: every episode ends exactly once (reward, truncated, or failed); an episode whose
agent made no request, or whose first request shares no token with its group's, fails;
nothing about an episode is guessed: a missing reward is a failure, not a zero.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import structlog

from grpo_stream.agents.batcher import Batcher
from grpo_stream.agents.chat import ChatFormat
from grpo_stream.agents.episode import AgentEpisode
from grpo_stream.agents.inbox import Inbox
from grpo_stream.agents.pool import AgentPool, Result
from grpo_stream.agents.server import EndpointServer
from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.episodes import Episode, EpisodeRun, TurnEngine
from grpo_stream.protocols import messages as m
from grpo_stream.ratelimit import RateLimit
from grpo_stream.sampling import Sampling

log = structlog.get_logger()

_IDLE_WAIT_S = 1.0


class AgentPlayer:
    """Plays PromptBatches as episodes of a user agent against the endpoint."""

    def __init__(
        self,
        settings: EnvSettings,
        engine: TurnEngine,
        tokenizer: Any,
        model: str,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.settings = settings
        self.stopping = stopping  # the generator was asked to stop: agents are cancelled
        self.engine = engine
        self.tokenizer = tokenizer
        fmt = ChatFormat(tokenizer) if getattr(tokenizer, "chat_template", None) else None
        self.fmt = fmt
        self.inbox = Inbox()
        self.server = EndpointServer(
            inbox=self.inbox,
            fmt=fmt,
            vocab=len(tokenizer),
            model=model,
            host=settings.endpoint_host,
            port=settings.endpoint_port,
        )
        self.pool = AgentPool(settings)
        self.warn = RateLimit()
        self.counts = {
            "episodes": 0,
            "episodes_failed": 0,
            "episodes_truncated": 0,
            "tool_calls": 0,
            "tool_calls_malformed": 0,
            "agent_timeouts": 0,
            "sampling_overridden": 0,
            "agent_turns": 0,
        }

    def __enter__(self) -> AgentPlayer:
        self.server.start()
        try:
            self.pool.start()
        except BaseException:
            self.server.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.pool.close()
        self.server.close()
        self.inbox.shutdown()

    def stats(self) -> dict[str, int]:
        """Counters for the generator's heartbeat."""
        return dict(self.counts)

    def play(self, batch: m.PromptBatch, sampling: Sampling) -> list[list[Episode]]:
        return self.play_run(EpisodeRun.of_batch(batch, sampling))

    def play_run(self, run: EpisodeRun) -> list[list[Episode]]:
        """Play G episodes per prompt; returns them grouped by prompt, in prompt order."""
        g = run.group_size
        eps = {
            run.key_base + i: AgentEpisode(
                key=run.key_base + i,
                secret=secrets.token_urlsafe(16),
                task={"prompt": run.prompts[i // g], "reference": dict(run.references[i // g])},
                traj=Episode(prompt_ids=[]),
            )
            for i in range(len(run.prompts) * g)
        }
        self.inbox.sampling = run.sampling
        self.inbox.open(list(eps.values()))
        batcher = Batcher(
            engine=self.engine,
            tokenizer=self.tokenizer,
            fmt=self.fmt,
            settings=self.settings,
            sampling=run.sampling,
        )
        try:
            jobs = {k: (self.server.url(ep.secret), ep.task) for k, ep in eps.items()}
            lost = self.pool.launch(jobs)
            for ep in eps.values():
                ep.started = time.monotonic()  # the agents' clocks start as they do
            self._ended(eps, batcher, lost)
            self._serve(eps, batcher)
        finally:
            self.inbox.close(list(eps.values()))
            batcher.add(self.inbox.take())
            batcher.drop(None, "the batch is over")
            batcher.close()
        order = list(eps.values())
        groups = [order[p * g : (p + 1) * g] for p in range(len(run.prompts))]
        out = []
        for prompt, group in zip(run.prompts, groups, strict=True):
            out.append(align_prompts([e.traj for e in group], self._fallback(prompt)))
        self._count(order, batcher.turns)
        return out

    def _serve(self, eps: dict[int, AgentEpisode], batcher: Batcher) -> None:
        while True:
            running = {k for k, ep in eps.items() if not ep.done}
            if not running and self.pool.due() is None:
                return  # every agent ended, and every worker that was told to stop one did
            if running and self.stopping():
                self._stop_all(eps, batcher)
                continue
            now = time.monotonic()
            talking = {k for k in running if eps[k].over is None}
            if batcher.ready(talking, now):
                batcher.step(talking)
                continue
            deadlines = [
                t
                for t in (batcher.due(), self.pool.due(), self._next_timeout(eps))
                if t is not None
            ]
            timeout = min(deadlines, default=now + _IDLE_WAIT_S) - now
            ready = wait([self.inbox.fileno(), *self.pool.conns()], max(0.0, timeout))
            now = time.monotonic()
            self._ended(eps, batcher, self.pool.collect(ready) + self.pool.check(now))
            batcher.add(self.inbox.take())
            self._time_out(eps, batcher, now)

    def _stop_all(self, eps: dict[int, AgentEpisode], batcher: Batcher) -> None:
        for ep in eps.values():
            if not ep.done:
                self.pool.cancel(ep.key, "the generator is stopping")
                self._end(ep, batcher, None, "the generator is stopping")

    def _next_timeout(self, eps: dict[int, AgentEpisode]) -> float | None:
        limit = self.settings.agent_timeout_s
        times = [
            ep.started + ep.waited_s + limit for ep in eps.values() if not ep.done and not ep.busy
        ]
        return min(times) if times else None

    def _time_out(self, eps: dict[int, AgentEpisode], batcher: Batcher, now: float) -> None:
        limit = self.settings.agent_timeout_s
        for ep in eps.values():
            if not ep.done and not ep.busy and ep.agent_seconds(now) > limit:
                cause = f"agent exceeded env.agent_timeout_s={limit}"
                self.counts["agent_timeouts"] += 1
                self.pool.cancel(ep.key, cause)
                self._end(ep, batcher, None, cause)

    def _ended(self, eps: dict[int, AgentEpisode], batcher: Batcher, results: list[Result]) -> None:
        for key, reward, error in results:
            self._end(eps[key], batcher, reward, error)

    def _end(
        self, ep: AgentEpisode, batcher: Batcher, reward: float | None, error: str | None
    ) -> None:
        """The agent of `ep` returned `reward` or failed with `error` (once)."""
        if ep.done:
            return  # stopped already (a timeout); its late result changes nothing
        ep.done = True
        batcher.drop(ep, "the agent has finished")
        traj = ep.traj
        if error is None and not traj.turn_starts:
            error = "the agent returned without a model turn"
        if error is not None or reward is None:
            traj.fail(error or "the agent returned no reward")
            count = self.warn.allow("agent.episode_failed")
            if count is not None:
                log.warning(
                    "agent.episode_failed",
                    episode=ep.key,
                    turns=len(traj.texts),
                    error=traj.error,
                    count=count,
                )
            return
        traj.turn_rewards[-1] = reward
        traj.ended = True

    def _fallback(self, prompt: str) -> list[int]:
        ids: list[int] = self.tokenizer(prompt)["input_ids"]
        return ids

    def _count(self, eps: list[AgentEpisode], turns: int) -> None:
        """Add a batch to the counters, and say what it was (`agent.batch_played`)."""
        batch = {
            "episodes": len(eps),
            "episodes_failed": sum(e.traj.error is not None for e in eps),
            "episodes_truncated": sum(e.traj.truncated for e in eps),
            "tool_calls": sum(e.calls for e in eps),
            "tool_calls_malformed": sum(e.malformed for e in eps),
            "sampling_overridden": sum(e.overridden for e in eps),
            "agent_turns": turns,
        }
        for key, value in batch.items():
            self.counts[key] += value
        log.info("agent.batch_played", **batch)


def align_prompts(episodes: list[Episode], fallback: list[int]) -> list[Episode]:
    """One prompt for a group: the longest common prefix of its episodes' first requests
    (what follows it in an episode moves to the front of its trajectory as template tokens,
    mask 0); episodes that made no request get it with no tokens after; `fallback` (the task
    prompt tokenized) when none made one. An episode sharing no token with the others
    fails (a Rollout has one prompt per group)."""
    played = [e for e in episodes if e.prompt_ids]
    common = list(played[0].prompt_ids) if played else list(fallback)
    for e in played[1:]:
        n = next(
            (i for i, (a, b) in enumerate(zip(common, e.prompt_ids, strict=False)) if a != b),
            min(len(common), len(e.prompt_ids)),
        )
        common = common[:n] if n else common
        if not n:
            e.fail("its first request shares no token with its group's")
    for e in episodes:
        extra = e.prompt_ids[len(common) :] if e.error is None else []
        e.prompt_ids = list(common)
        if e.error is not None:
            e.token_ids, e.mask, e.logprobs, e.turn_starts, e.texts = [], [], [], [], []
            e.turn_rewards = []
        if extra:
            e.token_ids = extra + e.token_ids
            e.mask = [0] * len(extra) + e.mask
            e.logprobs = [0.0] * len(extra) + e.logprobs
            e.turn_starts = [s + len(extra) for s in e.turn_starts]
    return episodes
