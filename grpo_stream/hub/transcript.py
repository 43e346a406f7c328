"""Episodes rewarded by a scorer, not by the generator that played them: the hub reads each
episode's turns off its token ids, a scorer replays the policy's turns against a fresh
environment (`grpo_stream.envs.replay`), and the hub checks the generator's environment turns
against what the environment said and trains with the scorer's rewards.

An episode (`grpo_stream.envs.episodes`) is, after the prompt, policy turns (loss mask 1,
each starting at one of its `turn_starts`) each followed by the tokens of the environment's
answer (mask 0, possibly none). `read` checks that shape and decodes each policy turn as the
engines decode it (special tokens skipped): that text, not one a generator sent, is what the
scorer's environment is shown. The environment answered every policy turn but one: a last
turn that ends at `env.max_episode_tokens` in a truncated episode with nothing after it was
cut at the budget and never shown to it.

`judge` takes the scorer's answers (`EpisodeScored`) and refuses the group when the
generator's episode disagrees with them: it played on after the environment ended the
episode, ended one the environment did not end, or holds environment turns that are not the
tokens of what the environment said (`TurnTokens`: the run's turn format, either way a policy
turn ended). An episode the generator reports failed is NaN (it can only leave an episode
out, never reward it); one whose environment failed in the scorer is NaN too.

Invariants: the rewards trained are the scorer's (the generator's `episode_rewards` and
`turn_rewards` are read only to see which episodes it reports failed); a group whose
transcript does not check out is never scored or trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol

import numpy as np

from grpo_stream.config.envs import EnvSettings
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.episodes import EpisodeScored, EpisodeScoreRequest
from grpo_stream.tasks import Task


class TurnTokens(Protocol):
    """The run's environment-turn format (`grpo_stream.envs.turns.TurnFormat.tokens`)."""

    def __call__(self, observation: str, policy_ended: bool) -> list[int]: ...


@dataclass(frozen=True)
class Turn:
    """One policy turn of an episode: its tokens [lo, hi), then its environment's [hi, end)."""

    lo: int
    hi: int
    end: int


@dataclass
class Episode:
    """One episode as the hub reads it."""

    turns: list[Turn]
    answered: int  # how many turns the environment answered (all, or all but a cut last one)
    actions: list[str]  # the answered turns' texts, decoded by the hub
    failed: bool  # the generator reports it failed
    truncated: bool
    length: int  # its tokens after the prompt


@dataclass
class Judged:
    """A group's rewards as the scorer's environment gave them."""

    rewards: np.ndarray  # float32 (G,): each episode's outcome (NaN: failed)
    turn_rewards: np.ndarray  # float32 (K,): each policy turn's (0 for a cut last turn)
    errors: list[str]


def _turns(mask: np.ndarray, starts: list[int]) -> list[Turn] | str:
    """An episode's turns from its loss mask and turn starts; why not, if they do not fit."""
    n = len(mask)
    if not starts:
        return [] if n == 0 else "tokens but no policy turn"
    if starts[0] != 0 or any(b < a for a, b in pairwise(starts)):
        return f"turn starts {starts} do not begin at 0 and increase"
    if starts[-1] > n:
        return f"a turn starts past its {n} tokens"
    turns = []
    for t, lo in enumerate(starts):
        nxt = starts[t + 1] if t + 1 < len(starts) else n
        zeros = np.flatnonzero(mask[lo:nxt] == 0)
        hi = lo + int(zeros[0]) if zeros.size else nxt
        if np.any(mask[hi:nxt] != 0):
            return f"turn {t}: sampled tokens inside the environment's turn"
        turns.append(Turn(lo, hi, nxt))
    return turns


class Transcripts:
    """The hub's side of recomputed episodes: read at intake, leased to scorers, judged."""

    def __init__(
        self,
        task: Task,
        tokenizer: Any,
        env: EnvSettings,
        turn_tokens: TurnTokens | None,
        rollouts: dict[int, m.Rollout],
    ) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.env = env
        self.turn_tokens = turn_tokens  # None: the hub has no tokenizer (no content checks)
        self.rollouts = rollouts  # the grouper's: rollouts waiting for a score
        self.read_: dict[int, list[Episode]] = {}  # group id -> its episodes, until judged

    def read(self, rollout: m.Rollout) -> str | None:
        """Read `rollout`'s episodes and keep them for its scorer; why not, if they do not
        have an episode's shape."""
        for gone in [gid for gid in self.read_ if gid not in self.rollouts]:
            del self.read_[gone]  # stale, quarantined or regenerated since it was read
        offsets = np.asarray(rollout.completion_offsets).tolist()
        turn_offsets = np.asarray(rollout.turn_offsets).tolist()
        starts = np.asarray(rollout.turn_starts).tolist()
        mask = np.asarray(rollout.loss_mask)
        ids = np.asarray(rollout.completion_ids)
        claimed = np.asarray(rollout.episode_rewards, dtype=np.float64)
        episodes = []
        for i in range(len(offsets) - 1):
            lo, hi = offsets[i], offsets[i + 1]
            turns = _turns(mask[lo:hi], starts[turn_offsets[i] : turn_offsets[i + 1]])
            if isinstance(turns, str):
                return f"episode rollout of group {rollout.group_id}: episode {i}: {turns}"
            if len(turns) > self.env.max_turns:
                return f"episode {i} of group {rollout.group_id}: over env.max_turns"
            length, truncated = hi - lo, bool(rollout.truncated[i])
            answered = len(turns)
            if turns and truncated and length >= self.env.max_episode_tokens:
                last = turns[-1]
                answered -= int(last.hi == last.end == length)  # cut at the budget: never shown
            rows = [ids[lo + t.lo : lo + t.hi].tolist() for t in turns[:answered]]
            actions = self.tokenizer.batch_decode(rows, skip_special_tokens=True) if rows else []
            failed = bool(np.isnan(claimed[i]))
            episodes.append(Episode(turns, answered, list(actions), failed, truncated, length))
        self.read_[rollout.group_id] = episodes
        return None

    def forget(self, group_id: int) -> None:
        self.read_.pop(group_id, None)

    def score_request(self, lease_id: int, group_id: int) -> EpisodeScoreRequest:
        """What a scorer replays: the hub's prompt and reference, the answered turns."""
        problem = self.task.problem(group_id)
        episodes = self.read_[group_id]
        counts = [0, *np.cumsum([len(e.actions) for e in episodes]).tolist()]
        return EpisodeScoreRequest(
            lease_id=lease_id,
            group_id=group_id,
            prompt=problem.prompt,
            reference=dict(problem.reference),
            actions=[a for e in episodes for a in e.actions],
            action_offsets=np.asarray(counts, dtype=np.int64),
        )

    def judge(self, rollout: m.Rollout, scored: EpisodeScored) -> Judged | str:
        """The group's rewards from the scorer's answers; why the generator's episodes
        disagree with them, if they do (the group is then refused)."""
        episodes = self.read_[rollout.group_id]
        total = sum(len(e.actions) for e in episodes)
        if not (len(scored.rewards) == len(scored.observations) == len(scored.done) == total):
            return f"scorer's answers are not one per action ({total})"
        if len(scored.errors) != len(episodes):
            return f"scorer's errors are not one per episode ({len(episodes)})"
        ids = np.asarray(rollout.completion_ids)
        offsets = np.asarray(rollout.completion_offsets).tolist()
        rewards, turn_rewards, errors = [], [], []
        first = 0
        for i, ep in enumerate(episodes):
            got = slice(first, first + len(ep.actions))
            first += len(ep.actions)
            answers = (scored.rewards[got], scored.observations[got], scored.done[got])
            mine = ids[offsets[i] : offsets[i + 1]]
            why = None if ep.failed or scored.errors[i] else self._disagrees(ep, mine, *answers)
            if why is not None:
                return f"episode {i} of group {rollout.group_id}: {why}"
            per_turn = [float(r) for r in answers[0]] + [0.0] * (len(ep.turns) - ep.answered)
            lost = ep.failed or bool(scored.errors[i])
            rewards.append(float("nan") if lost else float(sum(per_turn)))
            turn_rewards += [0.0 if lost else r for r in per_turn]
            errors += [f"episode[{i}]: {scored.errors[i]}"] if scored.errors[i] else []
        return Judged(np.asarray(rewards, np.float32), np.asarray(turn_rewards, np.float32), errors)

    def _disagrees(
        self, ep: Episode, ids: np.ndarray, rewards: Any, observations: list[str], done: list[bool]
    ) -> str | None:
        """Why the generator's episode is not what the environment said (None: it is)."""
        last = len(ep.actions) - 1
        if any(done[:last]) or (last >= 0 and done[last] and ep.answered < len(ep.turns)):
            return "the environment ended it, the generator played on"
        if last >= 0 and done[last] and ep.truncated:
            return "it is truncated, the environment ended it"
        if not (last >= 0 and done[last]) and not ep.truncated:
            return "it ended, the environment did not end it"
        if not np.all(np.isfinite(np.asarray(rewards, dtype=np.float64))):
            return "the scorer sent a non-finite reward without an error"
        if self.turn_tokens is None:
            return None
        for t, said in enumerate(observations):
            if done[t]:
                continue
            turn = ep.turns[t]
            held = ids[turn.hi : turn.end].tolist()
            ways = (self.turn_tokens(said, True), self.turn_tokens(said, False))
            if held in ways:
                continue
            room = self.env.max_episode_tokens - ep.length
            end = t == last and ep.answered == len(ep.turns) and ep.truncated
            cut = not held and end and max(len(w) for w in ways) > room
            if not cut:  # an answer that did not fit the budget is left out (and truncates)
                return f"turn {t}'s environment tokens are not what the environment said"
        return None
