"""The sandbox's one lifecycle: workers start loaded, a load failure is one error naming the
setting, a worker in doubt is replaced in its slot, memory is capped, close leaves nothing
running."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from structlog.testing import capture_logs

from grpo_stream.sandbox import pool as pool_module
from grpo_stream.sandbox.pool import Worker, WorkerCode, WorkerPool

# The workers' code is pickled by its module's name: importable as `sandbox_workers` here and
# in the workers (each takes this process's sys.path when it starts).
sys.path.insert(0, str(Path(__file__).parent))
import sandbox_workers


class PoolError(RuntimeError):
    pass


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ask(pool: WorkerPool[Worker], slot: int, message: list[Any]) -> Any:
    w = pool.workers[slot]
    assert w.send(message)
    assert w.conn.poll(30.0), "no reply within 30 s"
    return pool.receive(w)


def code_of(load: Callable[..., Any], *args: Any, memory_mb: int = 256) -> WorkerCode:
    return WorkerCode(
        kind="test",
        load=load,
        args=args,
        memory_limit_mb=memory_mb,
        setting="test.code = 'sandbox_workers'",
        error=PoolError,
    )


def workers_running() -> set[int]:
    """Pids of the processes the fork server forked (our grandchildren), alive."""
    me = psutil.Process()
    return {
        p.pid
        for p in me.children(recursive=True)
        if p.ppid() != me.pid and p.status() != psutil.STATUS_ZOMBIE
    }


@pytest.fixture
def make_pool() -> Iterator[Callable[..., WorkerPool[Worker]]]:
    pools: list[WorkerPool[Worker]] = []

    def factory(
        load: Callable[..., Any], *args: Any, count: int = 2, memory_mb: int = 256
    ) -> WorkerPool[Worker]:
        pool = WorkerPool(code_of(load, *args, memory_mb=memory_mb), count, Worker)
        pools.append(pool)
        pool.start()
        return pool

    yield factory
    for pool in pools:
        pool.close()


def test_start_returns_with_every_worker_loaded_and_answering(make_pool) -> None:
    pool = make_pool(sandbox_workers.echo, "t", count=3)
    assert [w.ready for w in pool.workers] == [True] * 3
    assert all(math.isinf(w.deadline) for w in pool.workers)
    replies = [ask(pool, slot, ["hello"]) for slot in range(3)]
    assert [r[:2] for r in replies] == [["echo", "t"]] * 3
    assert sorted(r[2] for r in replies) == sorted(pool.pids())


def test_code_that_does_not_load_is_one_error_naming_the_setting(make_pool) -> None:
    with pytest.raises(PoolError, match=r"^test\.code = 'sandbox_workers' does not load: Import"):
        make_pool(sandbox_workers.fails)


def test_a_worker_that_dies_loading_is_an_error_with_its_exit(make_pool) -> None:
    with pytest.raises(PoolError, match=r"test-worker-\d exited while loading .*exit code 3"):
        make_pool(sandbox_workers.exits)


def test_a_worker_slower_than_the_startup_timeout_is_an_error(
    make_pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "STARTUP_TIMEOUT_S", 1.0)
    with pytest.raises(PoolError, match=r"did not load test\.code .* within 1 s"):
        make_pool(sandbox_workers.sleeps, 30.0, count=1)


def test_a_failed_start_leaves_no_worker_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "STARTUP_TIMEOUT_S", 1.0)
    pool = WorkerPool(code_of(sandbox_workers.sleeps, 30.0), 2, Worker)
    before = workers_running()
    with pytest.raises(PoolError):
        pool.start()
    assert workers_running() - before == set()
    assert pool.workers == []


def test_replace_kills_the_worker_and_starts_a_loaded_one_in_its_slot(make_pool) -> None:
    pool = make_pool(sandbox_workers.echo, "t")
    old = pool.workers[1]
    old_pid = old.proc.pid
    with capture_logs() as logs:
        fresh = pool.replace(old, "it hung", lost=4)
    assert pool.workers[1] is fresh and fresh.slot == 1 and fresh.ready
    assert old_pid is not None and not alive(old_pid)
    assert ask(pool, 1, ["hello"])[2] == fresh.proc.pid
    assert pool.restarts == 1
    (event,) = [e for e in logs if e["event"] == "test.worker_replaced"]
    assert (event["slot"], event["old"], event["pid"]) == (1, old_pid, fresh.proc.pid)
    assert (event["cause"], event["lost"]) == ("it hung", 4)


def test_a_replacement_not_waited_for_says_ready_through_the_handshake(make_pool) -> None:
    pool = make_pool(sandbox_workers.echo, "t", count=1)
    fresh = pool.replace(pool.workers[0], "test", wait_ready=False)
    assert not fresh.ready and fresh.deadline < math.inf
    assert fresh.conn.poll(30.0)
    assert pool.handshake(fresh, pool.receive(fresh))
    assert fresh.ready and math.isinf(fresh.deadline)


def test_a_load_error_seen_through_the_handshake_raises(make_pool) -> None:
    pool = make_pool(sandbox_workers.echo, "t", count=1)
    with pytest.raises(PoolError, match="does not load: boom"):
        pool.handshake(pool.workers[0], ["load_error", "boom"])


def test_memory_past_the_cap_fails_in_the_worker_not_the_parent(make_pool) -> None:
    pool = make_pool(sandbox_workers.echo, "t", count=1, memory_mb=64)
    assert ask(pool, 0, ["hog", 16]) == ["allocated", 16]
    assert ask(pool, 0, ["hog", 512]) == ["memory"]


def test_close_stops_every_worker_and_kills_one_that_does_not_listen(make_pool) -> None:
    pool = make_pool(sandbox_workers.echo, "t")
    pids = pool.pids()
    assert pool.workers[0].send(["hang"])
    start = time.monotonic()
    pool.close()
    assert time.monotonic() - start < pool_module.STOP_GRACE_S + 5.0
    assert not any(alive(pid) for pid in pids)
    assert pool.workers == [] and pool.pids() == []
    pool.close()  # idempotent
