"""One prompt per group: the G episodes' first requests share their longest common prefix;
what an episode's first request has past it becomes template tokens (mask 0)."""

from __future__ import annotations

from grpo_stream.agents.player import align_prompts
from grpo_stream.envs.episodes import Episode


def episode(prompt: list[int], sampled: list[int]) -> Episode:
    ep = Episode(prompt_ids=prompt)
    ep.turn_starts, ep.turn_rewards, ep.texts = [0], [1.0], ["x"]
    ep.token_ids, ep.mask, ep.logprobs = list(sampled), [1] * len(sampled), [-0.5] * len(sampled)
    return ep


def test_equal_first_requests_keep_their_trajectories() -> None:
    a, b = episode([1, 2, 3], [7, 8]), episode([1, 2, 3], [9])
    align_prompts([a, b], fallback=[5])
    assert a.prompt_ids == b.prompt_ids == [1, 2, 3]
    assert (a.token_ids, a.mask, a.turn_starts) == ([7, 8], [1, 1], [0])


def test_a_longer_first_request_moves_its_tail_into_the_trajectory_as_template() -> None:
    a, b = episode([1, 2, 3], [7]), episode([1, 2, 4, 4], [9])
    align_prompts([a, b], fallback=[5])
    assert a.prompt_ids == b.prompt_ids == [1, 2]
    assert (b.token_ids, b.mask, b.logprobs) == ([4, 4, 9], [0, 0, 1], [0.0, 0.0, -0.5])
    assert (a.token_ids, a.turn_starts, b.turn_starts) == ([3, 7], [1], [2])


def test_an_episode_sharing_no_token_fails_and_one_that_never_asked_gets_the_prompt() -> None:
    a, stranger, silent = episode([1, 2], [7]), episode([9, 9], [8]), Episode(prompt_ids=[])
    silent.fail("the agent returned without a model turn")
    align_prompts([a, stranger, silent], fallback=[5])
    assert stranger.error == "its first request shares no token with its group's"
    assert stranger.prompt_ids == silent.prompt_ids == a.prompt_ids == [1, 2]
    assert stranger.token_ids == [] and stranger.turn_starts == stranger.turn_rewards == []


def test_a_group_where_no_agent_asked_takes_the_task_prompt() -> None:
    eps = [Episode(prompt_ids=[]), Episode(prompt_ids=[])]
    for ep in eps:
        ep.fail("agent raised")
    align_prompts(eps, fallback=[5, 6])
    assert [e.prompt_ids for e in eps] == [[5, 6], [5, 6]]
