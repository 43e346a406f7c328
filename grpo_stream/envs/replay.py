"""A scorer's replay of a group's episodes: the policy's turns, as the hub decoded them from
the token ids, played against fresh environments (in the scorer's own sandbox, `EnvPool`),
so an episode's rewards come from the environment's own code run where the generator has no
say (`grpo_stream.hub.transcript` checks the generator's episode against the answers).

An environment can be replayed when its observations and rewards are a function of the
prompt, the reference and the actions so far: it says so with a class attribute
`replayable = True` (`guess` and `calc` do). One that does not (it calls out, draws random
numbers, or is an agent: `env.agent`) cannot be recomputed: its episodes' rewards are the
generator's, and the hub says so when it starts (`env.rewards_trusted`, a warning).

Invariant: every action of the request gets one reward, observation and done flag, in
order; from the action where an episode's environment failed on, its rewards are NaN and
its error is set; actions after the environment said done are not played (NaN rewards:
the hub refuses such an episode, its generator played on).
"""

from __future__ import annotations

import math

import numpy as np

from grpo_stream.envs.episodes import EnvCalls
from grpo_stream.protocols.episodes import EpisodeScored, EpisodeScoreRequest


def replay(pool: EnvCalls, request: EpisodeScoreRequest, key_base: int = 0) -> EpisodeScored:
    """Play `request`'s actions episode by episode, all episodes in lockstep."""
    offsets = np.asarray(request.action_offsets).tolist()
    count = len(offsets) - 1
    keys = {key_base + i: i for i in range(count)}
    rewards = [math.nan] * len(request.actions)
    observations = [""] * len(request.actions)
    done = [False] * len(request.actions)
    errors = [""] * count
    reference = dict(request.reference)
    for key, answer in pool.reset({k: (request.prompt, reference) for k in keys}).items():
        if answer.step is None:
            errors[keys[key]] = answer.error or "environment failed"
    live = [k for k, i in keys.items() if not errors[i]]
    turn = 0
    while live := [k for k in live if offsets[keys[k]] + turn < offsets[keys[k] + 1]]:
        slot = {k: offsets[keys[k]] + turn for k in live}
        answers = pool.step({k: request.actions[slot[k]] for k in live})
        for k in list(live):
            step = answers[k].step
            if step is None:
                errors[keys[k]] = answers[k].error or "environment failed"
                live.remove(k)
                continue
            at = slot[k]
            rewards[at], observations[at], done[at] = step.reward, step.observation, step.done
            if step.done:
                live.remove(k)
        turn += 1
    pool.drop([k for k, i in keys.items() if not errors[i]])
    return EpisodeScored(
        lease_id=request.lease_id,
        group_id=request.group_id,
        rewards=np.asarray(rewards, dtype=np.float32),
        observations=observations,
        done=done,
        errors=errors,
    )
