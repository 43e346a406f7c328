"""Episodes rewarded by a scorer's replay, not by the generator that played them: the hub
reads each episode's turns off its token ids, and trains with the environment's rewards;
a generator whose episode disagrees with its environment (other environment turns, played
on after the end, ended early) gets nothing trained and the lie counted against it.

Episodes are played for real (`run_episodes` with the guess environment and the tiny-guess
tokenizer) by a scripted policy, so every token is what a generator would send."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_stream.config import load_config
from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.episodes import EpisodeRun, run_episodes
from grpo_stream.envs.local import LocalEnvs
from grpo_stream.envs.registry import env_factory
from grpo_stream.envs.replay import replay
from grpo_stream.envs.service import episode_rollout
from grpo_stream.envs.turns import TurnFormat
from grpo_stream.hub.dispatch import sampling_params
from grpo_stream.hub.registry import Peer
from grpo_stream.hub.transcript import Judged, Transcripts
from grpo_stream.models.loading import load_tokenizer
from grpo_stream.protocols import messages as m
from grpo_stream.protocols.episodes import EpisodeScoreRequest
from grpo_stream.sampling import Completion, Sampling
from grpo_stream.services.grouper import Grouper
from grpo_stream.tasks.base import Problem
from grpo_stream.transport.sockets import close_context

MODEL = "grpo-stream/tiny-guess"
TOK = load_tokenizer(MODEL)
ENV = EnvSettings(name="guess", max_turns=4, max_episode_tokens=64, guess_turns=4)
FMT = TurnFormat(TOK, chat=False)
PROMPT, REFERENCE = "guess 1-16:", {"target": 11, "high": 16}


@dataclass
class Script:
    """A policy that replies `replies[episode][turn]`, each reply ended with <eos> (a turn
    engine keeping no state: the turn is the number of <eos> in the row so far)."""

    replies: list[list[str]]

    def open_turns(self) -> Script:
        return self

    def close(self) -> None:
        pass

    def complete(
        self, keys: list[int], rows: list[list[int]], sampling: Sampling
    ) -> list[Completion]:
        turns = [row.count(TOK.eos_token_id) for row in rows]
        return [
            self._reply(self.replies[k][t], sampling.max_tokens)
            for k, t in zip(keys, turns, strict=True)
        ]

    @staticmethod
    def _reply(text: str, max_tokens: int) -> Completion:
        ids = [*TOK(text, add_special_tokens=False)["input_ids"], TOK.eos_token_id]
        kept = ids[:max_tokens]
        return Completion(kept, [-0.5] * len(kept), text, len(ids) > max_tokens)


class Task:
    def problem(self, index: int) -> Problem:
        return Problem(index, PROMPT, dict(REFERENCE))


def played(
    replies: list[list[str]], env: EnvSettings = ENV, gid: int = 3, problem: Problem | None = None
) -> m.Rollout:
    """The Rollout a generator sends for `replies`, played against the real environment."""
    problem = problem or Task().problem(gid)
    g = len(replies)
    run = EpisodeRun([problem.prompt], [problem.reference], g, Sampling(4, 1.0, seed=0))
    episodes = run_episodes(Script(replies), TOK, LocalEnvs(env_factory(env)), FMT, env, run)
    empty = np.zeros(0, np.int32)
    sampling = sampling_params(load_config(None, []).generator)
    offsets, logprobs = np.zeros(1, np.int64), np.zeros(0, np.float32)
    head = m.Rollout(
        1, gid, "generator-0", 0, empty, empty, offsets, logprobs, [], [], 0.1, sampling
    )
    return episode_rollout(head, episodes[0])


def judge(rollout: m.Rollout, env: EnvSettings = ENV) -> Judged | str:
    """The hub reads `rollout`, a scorer replays what it leased, the hub judges."""
    transcripts = Transcripts(Task(), TOK, env, FMT.tokens, {})
    assert transcripts.read(rollout) is None
    request = transcripts.score_request(lease_id=5, group_id=rollout.group_id)
    return transcripts.judge(rollout, replay(LocalEnvs(env_factory(env)), request))


HONEST = [["8", "12", "10", "11"], ["3", "9", "1", "2"]]
"""Target 11: the first finds it at its fourth guess, the second never does."""


def test_an_honest_group_is_trained_with_the_environments_rewards() -> None:
    got = judge(played(HONEST))
    assert isinstance(got, Judged)
    # the rules (envs/guess.py): 0.1 per guess inside the range still allowed, 1 more for the
    # number; "1" and "2" fall below the range 10-16 that "3", "9" left
    assert got.rewards.tolist() == pytest.approx([1.4, 0.2])
    assert got.turn_rewards.tolist() == pytest.approx([0.1, 0.1, 0.1, 1.1, 0.1, 0.1, 0, 0])
    assert got.errors == []


def test_the_generators_own_rewards_are_not_what_is_trained() -> None:
    lying = played(HONEST)
    lying.episode_rewards = np.array([0.0, 1.0], np.float32)  # swapped, as the attacker did
    lying.turn_rewards = np.zeros_like(lying.turn_rewards)
    got = judge(lying)
    assert isinstance(got, Judged) and got.rewards.tolist() == pytest.approx([1.4, 0.2])


def test_the_policy_turns_sent_to_the_scorer_are_the_hubs_decoding_of_the_ids() -> None:
    rollout = played(HONEST)
    rollout.texts = ["11", "11"]  # a generator's texts are never read
    transcripts = Transcripts(Task(), TOK, ENV, FMT.tokens, {})
    assert transcripts.read(rollout) is None
    request = transcripts.score_request(lease_id=5, group_id=rollout.group_id)
    assert isinstance(request, EpisodeScoreRequest)
    assert request.actions == [*HONEST[0], *HONEST[1]]
    assert (request.prompt, request.reference) == (PROMPT, REFERENCE)


def _env_turn(rollout: m.Rollout, episode: int, turn: int) -> tuple[int, int]:
    """[start, end) of the environment's turn after policy turn `turn` of `episode`."""
    lo = int(rollout.completion_offsets[episode])
    first = int(rollout.turn_offsets[episode])
    starts = [lo + int(s) for s in rollout.turn_starts[first : first + 4]]
    mask = rollout.loss_mask
    start = next(i for i in range(starts[turn], len(mask)) if mask[i] == 0)
    return start, starts[turn + 1]


def test_environment_turns_the_environment_did_not_say_are_refused() -> None:
    forged = played(HONEST)
    lo, hi = _env_turn(forged, 0, 0)  # "higher 9-16:" after the guess 8
    said = TOK("lower 10-16:", add_special_tokens=False)["input_ids"]  # as long as the truth
    ids = np.array(forged.completion_ids)
    ids[lo:hi] = said
    forged.completion_ids = ids
    assert "turn 0's environment tokens" in str(judge(forged))


def test_an_episode_the_generator_ended_before_the_environment_is_refused() -> None:
    two = ENV.model_copy(update={"max_turns": 2})  # both truncated after two guesses
    short = played(HONEST, env=two)
    short.truncated = [False, True]  # the first claimed ended while the game goes on
    assert "the environment did not end it" in str(judge(short, env=two))


def test_a_turn_cut_at_the_episode_budget_is_not_shown_to_the_environment() -> None:
    tight = ENV.model_copy(update={"max_episode_tokens": 16})
    rollout = played([["8", "12", "10", "11"]], env=tight)
    assert rollout.truncated == [True]
    got = judge(rollout, env=tight)
    assert isinstance(got, Judged)
    turns = len(rollout.turn_rewards)
    assert got.turn_rewards[-1] == 0.0 and len(got.turn_rewards) == turns


HUB_SETS = [
    'task.name="guess"',
    'env.name="guess"',
    f'model.name_or_path="{MODEL}"',
    "generator.group_size=2",
    "hub.groups_per_step=1",
    "env.max_turns=4",
    "env.max_episode_tokens=64",
    "env.guess_turns=4",
    "generator.max_tokens=4",
]
"""A guess run of the tiny model, one group a step of two episodes (a hub built in process)."""


@pytest.fixture
def hub(tmp_path: Path) -> Any:
    grouper = Grouper(load_config(None, [f'run.run_dir="{tmp_path}"', *HUB_SETS]))
    yield grouper
    grouper.server.close()
    close_context(grouper.ctx)


def episode_group(hub: Grouper) -> tuple[Peer, Peer, m.Rollout, list[m.Message]]:
    """A generator's episode group at to_score, its claimed rewards swapped; a scorer with a
    credit; what the hub sends (recorded)."""
    sent: list[m.Message] = []
    hub.server.send = lambda identity, msg: sent.append(msg) or True  # type: ignore[method-assign]
    gen = hub.registry.register(Peer("generator", "generator-0", b"gen", "h", 1, 0, {}), 0.0)
    scorer = hub.registry.register(Peer("scorer", "scorer-0", b"sc", "h", 2, 0, {}), 0.0)
    lease, _ = hub.ledger.take_for_generation("generator-0", 1, 0.0)
    (gid,) = lease.group_ids
    problem = hub.task.problem(gid)
    wrong = "16" if problem.reference["target"] != 16 else "1"  # in range once, then never
    rollout = played([[str(problem.reference["target"])], [wrong] * 4], gid=gid, problem=problem)
    rollout.lease_id, rollout.sampling = lease.lease_id, sampling_params(hub.cfg.generator)
    rollout.episode_rewards = np.array([0.0, 5.0], np.float32)  # the generator's claim
    scorer.credits = 1
    return gen, scorer, rollout, sent


def test_an_episode_group_waits_for_a_scorers_replay_and_trains_its_rewards(hub: Any) -> None:
    gen, scorer, rollout, sent = episode_group(hub)
    hub.intake.on_rollout(gen, rollout)
    assert hub.ledger.stage[rollout.group_id] == "to_score" and not len(hub.buffer)
    hub._dispatch(0.0)
    (request,) = [s for s in sent if isinstance(s, EpisodeScoreRequest)]
    hub.intake.on_episode_scored(scorer, replay(LocalEnvs(env_factory(hub.cfg.env)), request))
    (group,) = hub.buffer.groups()
    assert group.rewards.tolist() == pytest.approx([1.1, 0.1])  # found at once; never
    hub.ledger.check_invariant()


def test_a_forged_episode_is_generated_again_and_counted_against_its_generator(
    hub: Any,
) -> None:
    gen, scorer, rollout, sent = episode_group(hub)
    lo, hi = _env_turn(rollout, 1, 0)
    ids = np.array(rollout.completion_ids)
    ids[lo:hi] = TOK("x" * (hi - lo), add_special_tokens=False)["input_ids"]
    rollout.completion_ids = ids
    hub.intake.on_rollout(gen, rollout)
    hub._dispatch(0.0)
    (request,) = [s for s in sent if isinstance(s, EpisodeScoreRequest)]
    hub.intake.on_episode_scored(scorer, replay(LocalEnvs(env_factory(hub.cfg.env)), request))
    assert not len(hub.buffer) and rollout.group_id in hub.ledger.retry
    assert hub.trust.bad_rollouts["generator-0"] == 1
    hub.ledger.check_invariant()
