"""Episodes: the policy and an environment take turns; each episode becomes one
token-exact trajectory.

For the G episodes of each prompt, all in lockstep:

    reset every environment (prompt, reference); open the engine's turn session
    for turn in 1..env.max_turns:
        sample one reply per live episode from its exact token ids so far (the hf engine
            keeps the KV cache between turns and prefills only the tokens appended since)
        append the sampled ids (loss mask 1, behaviour log-probs as sampled)
        ask the environment: error -> the episode fails (NaN reward, its error recorded)
                             done  -> the episode ends with its rewards
                             else  -> append the observation's tokens (mask 0)
    episodes still live -> truncated

Invariants:
- `Episode.token_ids` (everything after the prompt) is the concatenation, in order, of the
  sampled ids of each policy turn and the tokenized environment turns (`envs.turns`); nothing
  is ever re-tokenized, so the trainer scores exactly the tokens the policy sampled;
- `mask[i]` is 1 exactly on sampled tokens; `logprobs[i]` is the behaviour log-prob of a
  sampled token and 0.0 on environment tokens (defined for model tokens only: the loss mask
  excludes the others, they are never read);
- len(token_ids) <= env.max_episode_tokens: a policy turn is cut at the budget and an
  observation that does not fit is not appended; either truncates the episode;
- `reward` is the sum of the turn rewards, NaN when the episode failed; every episode ends
  exactly once: done, truncated or failed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import structlog

from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.sandbox import Answer
from grpo_stream.envs.turns import TurnFormat
from grpo_stream.protocols import messages as m
from grpo_stream.ratelimit import RateLimit
from grpo_stream.sampling import Completion, Sampling

log = structlog.get_logger()


class TurnEngine(Protocol):
    """What the turn loop needs from an engine: sample continuations of token-id rows."""

    def complete(self, rows: list[list[int]], sampling: Sampling) -> list[Completion]: ...


class TurnSession(Protocol):
    """One batch of episodes' sampling state between turns (hf: the KV cache, so a turn
    prefills only what was appended since the last). Row i of a call is episode keys[i]'s
    whole row so far; an episode absent from a call has ended."""

    def complete(
        self, keys: list[int], rows: list[list[int]], sampling: Sampling
    ) -> list[Completion]: ...

    def close(self) -> None: ...


@runtime_checkable
class KeepsTurns(Protocol):
    """An engine that keeps state between turns (`HFEngine.open_turns`)."""

    def open_turns(self) -> TurnSession: ...


@dataclass
class Stateless:
    """The session of an engine that keeps nothing between turns: each row fed whole."""

    engine: TurnEngine

    def complete(
        self, keys: list[int], rows: list[list[int]], sampling: Sampling
    ) -> list[Completion]:
        return self.engine.complete(rows, sampling)

    def close(self) -> None:
        pass


def open_session(engine: TurnEngine) -> TurnSession:
    """The engine's own turn session where it keeps one, else the stateless one."""
    return engine.open_turns() if isinstance(engine, KeepsTurns) else Stateless(engine)


class EnvCalls(Protocol):
    """What the turn loop needs from the environments: `EnvPool` (sandboxed, the services)
    or `LocalEnvs` (in process, build time)."""

    warn: RateLimit

    def reset(self, episodes: dict[int, tuple[str, dict[str, Any]]]) -> dict[int, Answer]: ...

    def step(self, actions: dict[int, str]) -> dict[int, Answer]: ...

    def drop(self, keys: list[int]) -> None: ...


@dataclass
class Episode:
    """One episode's trajectory after the prompt."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_starts: list[int] = field(default_factory=list)
    """Index in token_ids where each policy turn's sampled ids begin."""
    turn_rewards: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    """Each policy turn's decoded text (what the environment was shown)."""
    truncated: bool = False
    error: str | None = None
    ended: bool = False

    @property
    def reward(self) -> float:
        return math.nan if self.error is not None else float(sum(self.turn_rewards))

    def fail(self, error: str) -> None:
        self.error, self.ended = error, True

    def add_policy_turn(self, c: Completion, room: int) -> bool:
        """Append a sampled reply, cut at `room` tokens; False when it was cut."""
        ids, lps = c.token_ids[:room], c.logprobs[:room]
        self.turn_starts.append(len(self.token_ids))
        self.turn_rewards.append(0.0)
        self.token_ids += ids
        self.mask += [1] * len(ids)
        self.logprobs += lps
        self.texts.append(c.text)
        return len(ids) == len(c.token_ids)

    def add_env_turn(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)


@dataclass
class EpisodeRun:
    """The inputs of one batch of episodes."""

    prompts: Sequence[str]
    references: Sequence[dict[str, Any]]
    group_size: int
    sampling: Sampling
    """Each turn's: at most `max_tokens` tokens a reply, turn t seeded by `child(t)` (agents:
    its seed seeds the batch's engine calls, `agents.batcher`)."""
    key_base: int = 0
    """Episode keys are key_base + index (distinct per batch in flight)."""

    @classmethod
    def of_batch(cls, batch: m.PromptBatch, sampling: Sampling) -> EpisodeRun:
        """The episodes of a hub's PromptBatch, keyed apart from every other lease's."""
        return cls(
            prompts=list(batch.prompts),
            references=[dict(r) for r in batch.references],
            group_size=batch.group_size,
            sampling=sampling,
            key_base=int(batch.lease_id) * len(batch.prompts) * batch.group_size,
        )


def run_episodes(
    engine: TurnEngine,
    tokenizer: Any,
    pool: EnvCalls,
    fmt: TurnFormat,
    settings: EnvSettings,
    run: EpisodeRun,
) -> list[list[Episode]]:
    """Play G episodes per prompt; returns them grouped by prompt, in prompt order."""
    prompt_ids: list[list[int]] = tokenizer(list(run.prompts))["input_ids"]
    g = run.group_size
    eps = [Episode(prompt_ids=list(ids)) for ids in prompt_ids for _ in range(g)]
    keys = {run.key_base + i: i for i in range(len(eps))}
    starts = {k: (run.prompts[i // g], dict(run.references[i // g])) for k, i in keys.items()}
    _apply_errors(pool, eps, keys, pool.reset(starts))
    session = open_session(engine)
    try:
        for turn in range(settings.max_turns):
            live = [k for k, i in keys.items() if not eps[i].ended]
            if not live:
                break
            _play_turn(session, pool, fmt, settings, run, eps, keys, live, turn)
    finally:
        session.close()
    unfinished = [k for k, i in keys.items() if not eps[i].ended]
    for k in unfinished:  # still playing after max_turns
        eps[keys[k]].truncated = eps[keys[k]].ended = True
    pool.drop([k for k, i in keys.items() if eps[i].truncated])
    return [eps[p * g : (p + 1) * g] for p in range(len(prompt_ids))]


def _play_turn(
    session: TurnSession,
    pool: EnvCalls,
    fmt: TurnFormat,
    settings: EnvSettings,
    run: EpisodeRun,
    eps: list[Episode],
    keys: dict[int, int],
    live: list[int],
    turn: int,
) -> None:
    budget = settings.max_episode_tokens
    for k in [k for k in live if len(eps[keys[k]].token_ids) >= budget]:
        eps[keys[k]].truncated = eps[keys[k]].ended = True  # no room left for a reply
    live = [k for k in live if not eps[keys[k]].ended]
    if not live:
        return
    room = {k: budget - len(eps[keys[k]].token_ids) for k in live}
    n = min(run.sampling.max_tokens, max(room.values()))
    rows = [eps[keys[k]].prompt_ids + eps[keys[k]].token_ids for k in live]
    completions = session.complete(live, rows, run.sampling.child(turn, max_tokens=n))
    actions: dict[int, str] = {}
    ended_with_eos: dict[int, bool] = {}
    for k, c in zip(live, completions, strict=True):
        ep = eps[keys[k]]
        if not ep.add_policy_turn(c, room[k]):
            ep.truncated = ep.ended = True  # the reply ran past the episode's budget
            continue
        actions[k] = c.text
        ended_with_eos[k] = bool(c.token_ids) and not c.truncated
    answers = pool.step(actions)
    going: dict[int, str] = {}
    for k in actions:
        ep, ans = eps[keys[k]], answers[k]
        if ans.step is None:
            ep.fail(ans.error or "environment failed")
            _log_failure(pool, k, ep)
            continue
        ep.turn_rewards[-1] = ans.step.reward
        if ans.step.done:
            ep.ended = True
            continue
        going[k] = ans.step.observation
    turns = fmt.tokens_many([(going[k], ended_with_eos[k]) for k in going])  # one call
    for k, ids in zip(going, turns, strict=True):
        ep = eps[keys[k]]
        if len(ep.token_ids) + len(ids) > budget:
            ep.truncated = ep.ended = True  # the observation does not fit the budget
            continue
        ep.add_env_turn(ids)


def _apply_errors(
    pool: EnvCalls, eps: list[Episode], keys: dict[int, int], answers: dict[int, Answer]
) -> None:
    for k, ans in answers.items():
        if ans.step is None:
            eps[keys[k]].fail(ans.error or "environment failed")
            _log_failure(pool, k, eps[keys[k]])


def _log_failure(pool: EnvCalls, key: int, ep: Episode) -> None:
    """One event per failed episode (folded by the pool's rate limiter when they flood)."""
    count = pool.warn.allow("env.episode_failed")
    if count is not None:
        log.warning(
            "env.episode_failed", episode=key, turns=len(ep.texts), error=ep.error, count=count
        )
