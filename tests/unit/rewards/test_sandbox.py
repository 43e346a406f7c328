"""RewardPool: hostile reward functions fail one completion each; the pool keeps serving."""

from __future__ import annotations

import contextlib
import inspect
import math
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from structlog.testing import capture_logs

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards.calls import ScoreResult
from grpo_stream.rewards.sandbox import RewardPool, RewardPoolError

sys.path.insert(0, str(Path(__file__).parent))
import bad_rewards

HERE = Path(__file__).parent
COMPLETIONS = ["ok", "boom", "fine!"]  # bad_rewards misbehave on "boom" only
TIMEOUT_S = 0.5


@pytest.fixture(autouse=True)
def _bad_rewards_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # Workers take the parent's sys.path at start(), so they import `bad_rewards` too.
    monkeypatch.syspath_prepend(str(HERE))


def spec(name: str, weight: float = 1.0, **params: float) -> RewardSpec:
    return RewardSpec(name=f"bad_rewards:{name}", weight=weight, params=params)


@pytest.fixture
def make_pool() -> Iterator[Callable[..., RewardPool]]:
    """Started pools, each closed (as the context manager it is) after the test."""
    with contextlib.ExitStack() as pools:

        def factory(
            specs: list[RewardSpec],
            workers: int = 1,
            memory_limit_mb: int = 64,
            timeout_s: float = TIMEOUT_S,
        ) -> RewardPool:
            pool = RewardPool(
                specs, workers=workers, timeout_s=timeout_s, memory_limit_mb=memory_limit_mb
            )
            return pools.enter_context(pool)

        yield factory


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def where(function: str, statement: str) -> str:
    """ "file:line in function" of the line of bad_rewards.`function` that holds `statement`."""
    lines, first = inspect.getsourcelines(getattr(bad_rewards, function))
    offset = next(i for i, line in enumerate(lines) if statement in line)
    return f"{Path(bad_rewards.__file__).relative_to(Path.cwd())}:{first + offset} in {function}"


HOSTILE = [
    (
        "raises",
        "raised",
        f"raised ValueError: no answer tag ({where('raises', 'raise ValueError')})",
    ),
    (
        "raises_system_exit",
        "raised",
        f"raised SystemExit: 2 ({where('raises_system_exit', 'sys.exit')})",
    ),
    ("sleeps_forever", "timeout", f"timeout after {TIMEOUT_S}s"),
    ("spins_forever", "timeout", f"timeout after {TIMEOUT_S}s"),
    ("exits", "died", "worker died (exit code 3)"),
    ("memory_bomb", "memory", "memory limit"),
    ("returns_nan", "non_finite", "returned non-finite value nan"),
    ("returns_inf", "non_finite", "returned non-finite value -inf"),
    ("returns_string", "not_a_number", "returned str, not a number"),
]


@pytest.mark.parametrize(("name", "kind", "cause"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_reward_fails_only_its_completion(make_pool, name: str, kind: str, cause: str):
    # only the timeouts need the short limit: on a loaded machine a memory bomb or a dying
    # worker could outlast it and be reported as a timeout instead of its own failure
    pool = make_pool([spec(name)], timeout_s=TIMEOUT_S if kind == "timeout" else 30.0)
    result = pool.score("p", COMPLETIONS, {})
    assert result.components[0, 0] == 2.0
    assert math.isnan(result.components[0, 1])
    assert result.components[0, 2] == 5.0
    assert result.errors == [f"bad_rewards:{name}[1]: {cause}"]
    assert pool.stats()["failures"] == {kind: 1}


@pytest.mark.parametrize(("name", "kind", "cause"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_pool_scores_correctly_after_hostile_call(make_pool, name: str, kind: str, cause: str):
    pool = make_pool([spec(name), spec("length")])
    pool.score("p", ["boom"], {})
    result = pool.score("p", ["abc", "de"], {"answer": "1"})
    np.testing.assert_array_equal(result.components, [[3.0, 2.0], [3.0, 2.0]])
    np.testing.assert_array_equal(result.rewards, [6.0, 4.0])
    assert result.errors == []


def test_rewards_are_the_weighted_sum_of_components(make_pool):
    pool = make_pool([spec("length", weight=0.5), spec("scaled_length", weight=-2.0, scale=3.0)])
    result = pool.score("p", ["a", "abcd"], {})
    assert result.component_names == ["bad_rewards:length", "bad_rewards:scaled_length"]
    assert result.components.dtype == np.float32 and result.components.shape == (2, 2)
    np.testing.assert_array_equal(result.components, [[1.0, 4.0], [3.0, 12.0]])
    assert result.rewards.dtype == np.float32
    np.testing.assert_array_equal(result.rewards, [0.5 - 6.0, 2.0 - 24.0])


def test_reward_is_nan_where_any_component_failed(make_pool):
    pool = make_pool([spec("length"), spec("raises", weight=0.0)])
    result = pool.score("p", ["boom", "ok"], {})
    assert result.components[0, 0] == 4.0
    assert math.isnan(result.rewards[0])
    assert result.rewards[1] == 2.0


def test_several_idle_workers_share_one_group(make_pool):
    pool = make_pool([spec("worker_pid")], workers=3)
    result = pool.score("p", ["a", "b", "c", "d", "e", "f"], {})
    used = {int(pid) for pid in result.components[0]}
    assert used == set(pool.worker_pids())
    assert len(used) == 3


def test_each_group_is_one_worker_call_when_groups_keep_the_workers_busy(make_pool):
    pool = make_pool([spec("worker_pid"), spec("worker_pid")], workers=2)
    first, *later = [pool.submit("p", ["a", "bb", "ccc"], {}) for _ in range(4)]
    results = dict(collect_all(pool))
    # the first group found both workers idle: each ran one component of it
    assert {int(pid) for pid in results[first].components.flat} == set(pool.worker_pids())
    for ticket in later:  # the others waited for a worker: each ran on one, whole
        assert len(set(results[ticket].components.flat)) == 1


def test_a_completion_repeated_in_its_group_is_scored_once(make_pool):
    pool = make_pool([spec("counts_calls")])
    result = pool.score("p", ["a", "a", "b", "a", "b"], {})
    np.testing.assert_array_equal(result.components[0], [1.0, 1.0, 2.0, 1.0, 2.0])
    assert pool.stats()["calls"] == 2


def test_the_cache_does_not_cross_groups(make_pool):
    pool = make_pool([spec("counts_calls")])
    first = pool.score("p", ["a", "a"], {})
    second = pool.score("p", ["a"], {})
    np.testing.assert_array_equal(first.components[0], [1.0, 1.0])
    np.testing.assert_array_equal(second.components[0], [2.0])


def test_the_cache_does_not_cross_references(make_pool):
    pool = make_pool([RewardSpec(name="exact_match")])
    one = pool.submit("p", ["1", "2", "1"], {"answer": "1"})
    two = pool.submit("p", ["1", "2", "1"], {"answer": "2"})
    results = dict(collect_all(pool))
    np.testing.assert_array_equal(results[one].rewards, [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(results[two].rewards, [0.0, 1.0, 0.0])


@pytest.mark.parametrize(("name", "kind", "cause"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_call_fails_every_copy_of_its_completion_only(
    make_pool, name: str, kind: str, cause: str
):
    pool = make_pool([spec(name)], timeout_s=TIMEOUT_S if kind == "timeout" else 30.0)
    result = pool.score("p", ["ok", "boom", "fine!", "ok", "boom"], {})
    np.testing.assert_array_equal(result.components[0, [0, 2, 3]], [2.0, 5.0, 2.0])
    assert np.isnan(result.components[0, [1, 4]]).all()
    assert result.errors == [f"bad_rewards:{name}[1]: {cause}", f"bad_rewards:{name}[4]: {cause}"]
    assert pool.stats()["failures"] == {kind: 1}


def test_a_hang_in_one_group_spares_the_other_groups_in_flight(make_pool):
    pool = make_pool([spec("sleeps_forever")], workers=2)
    tickets = [pool.submit("p", texts, {}) for texts in (["a", "bb"], ["ccc", "boom"], ["dddd"])]
    results = dict(collect_all(pool))
    first, hung, last = (results[t] for t in tickets)
    np.testing.assert_array_equal(first.components[0], [1.0, 2.0])
    np.testing.assert_array_equal(last.components[0], [4.0])
    assert hung.components[0, 0] == 3.0 and math.isnan(hung.components[0, 1])
    assert hung.errors == [f"bad_rewards:sleeps_forever[1]: timeout after {TIMEOUT_S}s"]


def collect_all(pool: RewardPool) -> list[tuple[int, ScoreResult]]:
    done: list[tuple[int, ScoreResult]] = []
    while pool.busy():
        done += pool.collect(math.inf)
    return done


def test_empty_group_gives_empty_arrays(make_pool):
    pool = make_pool([spec("length"), spec("raises")])
    result = pool.score("p", [], {})
    assert result.rewards.shape == (0,)
    assert result.components.shape == (2, 0)


def test_timed_out_worker_is_killed_and_replaced(make_pool):
    pool = make_pool([spec("spins_forever")])
    (old_pid,) = pool.worker_pids()
    pool.score("p", ["boom"], {})
    (new_pid,) = pool.worker_pids()
    assert new_pid != old_pid
    assert not alive(old_pid)
    assert pool.stats()["restarts"] == 1


def test_failures_and_restarts_are_logged(make_pool):
    pool = make_pool([spec("exits")])
    with capture_logs() as logs:
        pool.score("p", ["x", "boom"], {})
    failed = [e for e in logs if e["event"] == "reward.failed"]
    restarted = [e for e in logs if e["event"] == "reward.worker_replaced"]
    assert [(e["reward"], e["index"], e["cause"]) for e in failed] == [
        ("bad_rewards:exits", 1, "worker died (exit code 3)")
    ]
    assert len(restarted) == pool.stats()["restarts"] >= 1


def test_stats_count_calls_failures_and_restarts(make_pool):
    pool = make_pool([spec("raises"), spec("exits")])
    pool.score("p", ["boom", "a"], {})
    # the worker died with calls of its chunk unanswered: they ran again one by one, and
    # "exits" took that worker too
    assert pool.stats() == {
        "calls": 4,
        "failures": {"raised": 1, "died": 1},
        "restarts": 2,
        "workers": 1,
    }


def test_a_raised_error_is_logged_once_with_its_traceback(make_pool):
    pool = make_pool([spec("reads_product")], workers=2)
    with capture_logs() as logs:
        for _ in range(3):
            result = pool.score("p", ["a", "b", "c", "d"], {"answer": "1"})
    (error,) = [e for e in logs if e["event"] == "reward.error"]
    at = where("reads_product", 'reference["product"]')
    assert error["reward"] == "bad_rewards:reads_product"
    assert error["error"] == f"raised KeyError: 'product' ({at})"
    path, line = at.split(" in ")[0].split(":")
    assert f'File "{Path(path).resolve()}", line {line}, in reads_product' in error["traceback"]
    assert error["traceback"].rstrip().endswith("KeyError: 'product'")
    assert result.errors[0] == f"bad_rewards:reads_product[0]: raised KeyError: 'product' ({at})"


def test_distinct_errors_are_each_logged_with_their_traceback(make_pool):
    pool = make_pool([spec("reads_product"), spec("raises")])
    with capture_logs() as logs:
        pool.score("p", ["boom", "a", "boom"], {})
    errors = [e for e in logs if e["event"] == "reward.error"]
    rewards = sorted(e["reward"] for e in errors)
    assert rewards == ["bad_rewards:raises", "bad_rewards:reads_product"]


def test_the_workers_cpu_time_is_counted(make_pool):
    pool = make_pool([spec("burns_cpu")])
    assert pool.cpu_s() < 0.05
    pool.score("p", ["a", "b", "c", "d"], {})
    assert pool.cpu_s() >= 4 * 0.05
    assert pool.completions == 4


def test_close_leaves_no_worker_processes(make_pool):
    pool = make_pool([spec("length")], workers=2)
    pids = pool.worker_pids()
    pool.score("p", ["a"], {})
    pool.close()
    assert len(pids) == 2
    assert not any(alive(pid) for pid in pids)


def test_context_manager_starts_and_closes():
    with RewardPool([spec("length")], workers=1, timeout_s=1.0, memory_limit_mb=256) as pool:
        assert pool.score("p", ["abc"], {}).rewards.tolist() == [3.0]
        pids = pool.worker_pids()
    assert not any(alive(pid) for pid in pids)


def test_unloadable_reward_fails_start_and_leaves_no_workers():
    pool = RewardPool([spec("no_such_function")], workers=2, timeout_s=1.0, memory_limit_mb=256)
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    with pytest.raises(RewardPoolError, match="no_such_function"):
        pool.start()
    new = [p for p in me.children(recursive=True) if p.pid not in before and alive(p.pid)]
    # Only the fork server (and its resource tracker) may be new: workers are its children.
    assert all(p.ppid() == me.pid for p in new)


def test_score_before_start_is_an_error():
    pool = RewardPool([spec("length")], workers=1, timeout_s=1.0, memory_limit_mb=256)
    with pytest.raises(RewardPoolError, match="not started"):
        pool.score("p", ["a"], {})


def test_hang_in_one_chunk_spares_the_other_workers_chunks(make_pool):
    pool = make_pool([spec("sleeps_forever")], workers=2)
    result = pool.score("p", ["a", "boom", "abc", "abcd"], {})
    np.testing.assert_array_equal(result.components[0, [0, 2, 3]], [1.0, 3.0, 4.0])
    assert result.errors == [f"bad_rewards:sleeps_forever[1]: timeout after {TIMEOUT_S}s"]


ORPHAN_SCRIPT = """
import os, signal, sys, threading, time
sys.path.insert(0, sys.argv[1])
from grpo_stream.rewards.sandbox import RewardPool
from grpo_stream.config.tasks import RewardSpec

pool = RewardPool([RewardSpec(name="bad_rewards:spins_forever")], 1, 600.0, 256)
pool.start()
threading.Thread(target=pool.score, args=("p", ["boom"], {}), daemon=True).start()
time.sleep(0.5)  # let the worker start spinning
print("PIDS", *pool.worker_pids(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_busy_workers_die_when_the_parent_is_killed(tmp_path: Path):
    out = tmp_path / "out.txt"
    with out.open("w") as stdout:  # a file, not a pipe: surviving workers would hold a pipe open
        code = subprocess.call([sys.executable, "-c", ORPHAN_SCRIPT, str(HERE)], stdout=stdout)
    assert code == -signal.SIGKILL
    (line,) = [line for line in out.read_text().splitlines() if line.startswith("PIDS")]
    workers = [p for p in map(_process_or_none, line.split()[1:]) if p is not None]
    _, survivors = psutil.wait_procs(workers, timeout=10)
    for survivor in survivors:  # clean up before failing
        survivor.kill()
    assert survivors == []


def _process_or_none(pid: str) -> psutil.Process | None:
    try:
        return psutil.Process(int(pid))
    except psutil.NoSuchProcess:
        return None
