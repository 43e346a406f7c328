"""EnvPool: an environment that raises, hangs, returns non-text or kills its worker fails
its own episode with one error line; the pool keeps serving."""

from __future__ import annotations

import pytest

from grpo_stream.config.envs import EnvSettings
from grpo_stream.envs.sandbox import EnvPool, EnvPoolError

BAD = {"bad": True}
GOOD = {"bad": False}


def _play_two_turns(pool: EnvPool) -> dict[int, str | None]:
    """Episode 0 misbehaves at turn 2, episode 1 does not: the errors after turn 2."""
    pool.reset({0: ("p", BAD), 1: ("p", GOOD)})
    first = pool.step({0: "a", 1: "a"})
    assert all(a.step is not None for a in first.values())
    second = pool.step({0: "a", 1: "a"})
    return {k: a.error for k, a in second.items()}


@pytest.mark.parametrize(
    ("env", "cause"),
    [
        ("Raises", "step raised ValueError: bad env"),
        ("NonText", "int observation, not text"),
        ("NotAStep", "returned dict, not a Step"),
    ],
)
def test_a_bad_step_fails_only_its_episode(make_pool, env: str, cause: str) -> None:
    pool = make_pool(f"bad_envs:{env}")
    errors = _play_two_turns(pool)
    assert errors[1] is None
    assert errors[0] is not None and cause in errors[0]
    assert pool.restarts == 0


def test_a_hanging_env_times_out_and_its_worker_is_replaced(make_pool) -> None:
    pool = make_pool("bad_envs:Hangs", timeout_s=0.5)
    pid = pool.worker_pids()[0]
    pool.reset({0: ("p", BAD)})
    pool.step({0: "a"})
    answer = pool.step({0: "a"})[0]
    assert answer.error is not None and "env.timeout_s=0.5" in answer.error
    assert pool.restarts == 1 and pool.worker_pids()[0] != pid
    pool.reset({5: ("p", GOOD)})  # the fresh worker serves new episodes
    assert pool.step({5: "a"})[5].step is not None


def test_an_env_that_kills_its_worker_fails_every_episode_the_worker_held(make_pool) -> None:
    pool = make_pool("bad_envs:Exits")
    errors = _play_two_turns(pool)
    assert errors[0] == "environment worker died"
    # episode 1 lived in the same worker: its state is gone, so it fails rather than
    # continue against an environment that never saw its history
    assert errors[1] is not None
    assert pool.restarts == 1


def test_an_env_that_does_not_load_is_one_line_naming_the_setting() -> None:
    pool = EnvPool(EnvSettings(name="no_such_module:Env"))
    with pytest.raises(EnvPoolError, match=r"env\.name = 'no_such_module:Env' does not load"):
        pool.start()
    pool.close()
