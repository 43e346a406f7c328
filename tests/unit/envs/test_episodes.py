"""The turn loop on the tiny-guess model: trajectories are built turn by turn, bad
environments end their episode once (NaN or truncated), budgets hold."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from structlog.testing import capture_logs

from grpo_stream.config.envs import EnvSettings
from grpo_stream.engines.turn_cache import TurnCache
from grpo_stream.envs.episodes import Episode, EpisodeRun, Stateless, open_session, run_episodes
from grpo_stream.envs.sandbox import EnvPool
from grpo_stream.envs.turns import TurnFormat
from grpo_stream.protocols import messages as m
from grpo_stream.sampling import Sampling


def play(
    engine: Any,
    pool: EnvPool,
    refs: list[dict[str, Any]],
    group: int = 2,
    via: Any = None,
    **env: Any,
) -> list[Episode]:
    """`via`: what samples the turns (default: the engine itself)."""
    settings = EnvSettings(name=pool.settings.name, **env)
    run = EpisodeRun(
        prompts=["guess 1-16:"] * len(refs), references=refs, group_size=group,
        sampling=Sampling(3, seed=7),
    )  # fmt: skip
    fmt = TurnFormat(engine.tokenizer, chat=False)
    groups = run_episodes(via or engine, engine.tokenizer, pool, fmt, settings, run)
    return [e for g in groups for e in g]


def test_trajectory_is_sampled_ids_then_tokenized_observations(engine, make_pool) -> None:
    pool = make_pool("bad_envs:ThreeTurns")
    (ep,) = play(engine, pool, [{}], group=1)
    tok = engine.tokenizer
    assert len(ep.turn_starts) == 3 and ep.turn_rewards == [0.1, 0.2, 1.0]
    for k, start in enumerate(ep.turn_starts):
        end = ep.turn_starts[k + 1] if k + 1 < 3 else len(ep.token_ids)
        sampled = [t for t, m in zip(ep.token_ids[start:end], ep.mask[start:end], strict=True) if m]
        env = [t for t, m in zip(ep.token_ids[start:end], ep.mask[start:end], strict=True) if not m]
        assert ep.mask[start:end] == sorted(ep.mask[start:end], reverse=True)  # model, then env
        assert tok.decode(sampled, skip_special_tokens=True) == ep.texts[k]
        if k < 2:  # the environment's answer, tokenized alone
            assert env == tok(f"t{k + 1}:", add_special_tokens=False)["input_ids"]
    assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.mask, strict=True) if not m)
    assert all(lp < 0.0 for lp, m in zip(ep.logprobs, ep.mask, strict=True) if m)
    assert math.isclose(ep.reward, 1.3) and not ep.truncated and ep.error is None


def test_an_env_that_raises_fails_its_episode_once_with_nan(engine, make_pool) -> None:
    pool = make_pool("bad_envs:Raises")
    with capture_logs() as logs:
        bad, good = play(engine, pool, [{"bad": True}, {"bad": False}], group=1)
    assert math.isnan(bad.reward) and "bad env" in (bad.error or "")
    assert len(bad.texts) == 2  # it stopped at the bad turn
    assert good.error is None and math.isclose(good.reward, 0.75)
    events = [e for e in logs if e["event"] == "env.episode_failed"]
    assert len(events) == 1 and "bad env" in events[0]["error"]


def test_a_hanging_env_fails_its_episode_and_the_next_batch_is_served(engine, make_pool) -> None:
    pool = make_pool("bad_envs:Hangs", timeout_s=0.5)
    eps = play(engine, pool, [{"bad": True}], group=1, timeout_s=0.5)
    assert math.isnan(eps[0].reward) and "timeout" in (eps[0].error or "")
    again = play(engine, pool, [{"bad": False}], group=1, timeout_s=0.5)
    assert again[0].error is None and math.isclose(again[0].reward, 0.75)


def test_a_non_text_observation_fails_the_episode(engine, make_pool) -> None:
    pool = make_pool("bad_envs:NonText")
    (ep,) = play(engine, pool, [{"bad": True}], group=1)
    assert math.isnan(ep.reward) and "not text" in (ep.error or "")


def test_an_episode_past_max_turns_is_truncated_with_its_rewards(engine, make_pool) -> None:
    pool = make_pool("bad_envs:Endless")
    eps = play(engine, pool, [{}], group=3, max_turns=3, max_episode_tokens=90)
    for ep in eps:
        assert ep.truncated and ep.error is None
        assert len(ep.turn_rewards) == 3 and math.isclose(ep.reward, 1.5)


def test_an_observation_over_the_budget_truncates_and_is_not_appended(engine, make_pool) -> None:
    pool = make_pool("bad_envs:Chatty")
    eps = play(engine, pool, [{}], group=2, max_episode_tokens=40)
    for ep in eps:
        assert ep.truncated and ep.error is None and len(ep.texts) == 1
        assert all(ep.mask) and len(ep.token_ids) <= 40  # nothing of the observation


class WholeRows:
    """The hf engine without its turn cache: episodes then prefill every row whole."""

    def __init__(self, engine: Any) -> None:
        self.complete = engine.complete


def test_kv_reuse_plays_the_episodes_the_stateless_path_plays(engine, make_pool) -> None:
    """The hf engine's turn cache (episodes ending at different turns are dropped from it)
    samples the trajectories that prefilling every row whole samples, with the same seed."""
    pool = make_pool("guess")
    refs = [{"target": t, "high": 16} for t in (3, 8, 11, 16)]
    reused = play(engine, pool, refs, group=4)
    whole = play(engine, pool, refs, group=4, via=WholeRows(engine))
    assert isinstance(open_session(engine), TurnCache)
    assert isinstance(open_session(WholeRows(engine)), Stateless)
    assert len({len(e.texts) for e in reused}) > 1  # episodes ended at different turns
    for a, b in zip(reused, whole, strict=True):
        assert a.token_ids == b.token_ids and a.turn_rewards == b.turn_rewards
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-5


def test_the_episodes_of_two_leases_never_share_a_key() -> None:
    def run(lease_id: int) -> EpisodeRun:
        batch = m.PromptBatch(
            lease_id=lease_id,
            group_ids=np.array([4, 5], np.int64),
            prompts=["guess 1-16:", "guess 1-16:"],
            references=[{"target": 3, "high": 16}, {"target": 9, "high": 16}],
            group_size=3,
            min_version=0,
            sampling=m.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=4),
        )
        return EpisodeRun.of_batch(batch, Sampling(4, seed=0))

    first, second = run(0), run(1)
    assert first.references == [{"target": 3, "high": 16}, {"target": 9, "high": 16}]
    keys = [set(range(r.key_base, r.key_base + 2 * r.group_size)) for r in (first, second)]
    assert len(keys[0]) == len(keys[1]) == 6 and not keys[0] & keys[1]
