"""Killing services mid-run (SIGKILL, SIGSTOP): the run completes, nothing is lost or
trained twice, and the hub's counters prove it."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    Run,
    assert_accounting,
    assert_exactly_once,
    hub_events,
    killed_after_step_two,
    metrics,
    pid_of,
    status,
)

pytestmark = pytest.mark.slow
STEPS = 30
# at least 0.3 s a step: a run of 30 tiny steps can end in ~7 s, before a kill 1.5 s after
# step 3 lands (it did once shared prompts made the trainer's step 0.04 s)
PACED = ("--set", "trainer.throttle_s=0.3")


def killed_and_restarted(
    run_dir: Path, background_run: list[Run], instance: str
) -> tuple[Run, list[dict[str, Any]], dict[str, int]]:
    """A run (run.restarts=2) in which `instance` is killed after step 2: the run, the
    instance's joins, and the hub's counters once every group ended exactly once."""
    run = Run(run_dir, STEPS, "--set", "run.restarts=2")
    background_run.append(run)
    joins = killed_after_step_two(run, instance)
    return run, joins, assert_accounting(run.run_dir, STEPS)


def test_generator_killed_is_redispatched_and_restarted(
    tmp_path: Path, background_run: list[Run]
) -> None:
    run, joins, counters = killed_and_restarted(tmp_path / "run", background_run, "generator-0")
    assert counters["requeued_generate"] + counters["redispatched"] > 0 or hub_events(
        run.run_dir, "peer.lost"
    )
    assert len(joins) >= 2  # the restarted generator joined again and got work


def test_scorer_killed_is_redispatched_and_restarted(
    tmp_path: Path, background_run: list[Run]
) -> None:
    _, joins, _ = killed_and_restarted(tmp_path / "run", background_run, "scorer-0")
    assert len(joins) >= 2 and joins[-1]["joined"] >= 2  # the restarted scorer came back


def test_trainer_killed_resumes_from_checkpoint(tmp_path: Path, background_run: list[Run]) -> None:
    run = Run(
        tmp_path / "run", STEPS, "--set", "run.restarts=2", "--set", "trainer.checkpoint_every=2"
    )
    background_run.append(run)
    run.wait_steps(5)
    pid = pid_of(run.run_dir, "trainer-0")
    _wait_for_new_event(run.run_dir / "logs" / "trainer-trainer-0.jsonl", "weights.published")
    os.kill(pid, signal.SIGKILL)  # right after a publish: generators may be mid-fetch
    assert run.finish() == 0, run.output()[-3000:]
    rows = metrics(run.run_dir)
    assert rows[-1]["step"] == STEPS
    versions = [r["policy_version"] for r in rows]
    assert all(a < b for a, b in itertools.pairwise(versions)), versions  # unique forever
    applied = [
        json.loads(line)["version"]
        for line in (run.run_dir / "logs" / "generator-generator-0.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "weights.applied"
    ]
    assert all(a < b for a, b in itertools.pairwise(applied)), applied
    gen_log = (run.run_dir / "logs" / "generator-generator-0.jsonl").read_text()
    assert gen_log.count('"event": "generator.ready"') == 1  # it survived the trainer's death
    assert_accounting(run.run_dir, STEPS)
    assert_exactly_once(run.run_dir, STEPS)


def _wait_for_new_event(path: Path, event: str, timeout: float = 60) -> None:
    seen = path.read_text().count(f'"event": "{event}"')
    deadline = time.monotonic() + timeout
    while path.read_text().count(f'"event": "{event}"') == seen:
        if time.monotonic() > deadline:
            raise AssertionError(f"no new {event} in {path} within {timeout}s")
        time.sleep(0.01)


def _steps_recorded_once(run_dir: Path) -> list[int]:
    """The steps in metrics.jsonl, in order: across a hub's death the trainer neither skips
    nor repeats one (a step it trained twice would be there twice)."""
    return [int(r["step"]) for r in metrics(run_dir)]


def test_hub_killed_restarts_from_its_checkpoint(tmp_path: Path, background_run: list[Run]) -> None:
    run = Run(tmp_path / "run", STEPS, "--set", "run.restarts=2", *PACED)
    background_run.append(run)
    run.wait_steps(3)
    time.sleep(1.5)  # let the hub write a checkpoint
    os.kill(int(status(run.run_dir)["counters"]["hub_pid"]), signal.SIGKILL)
    assert run.finish() == 0, run.output()[-3000:]
    assert len(hub_events(run.run_dir, "hub.resumed")) == 1
    assert _steps_recorded_once(run.run_dir) == list(range(1, STEPS + 1))
    assert_accounting(run.run_dir, STEPS)
    assert_exactly_once(run.run_dir, STEPS)


def test_hub_killed_five_times_at_random_trains_every_group_once(
    tmp_path: Path, background_run: list[Run]
) -> None:
    steps = 60
    run = Run(tmp_path / "run", steps, "--set", "run.restarts=6", *PACED)
    background_run.append(run)
    rng = random.Random()
    for kill in range(5):
        run.wait_steps(6 + kill * 9)
        time.sleep(rng.uniform(0.0, 2.0))  # anywhere in the hub's 1 s checkpoint cycle
        os.kill(int(status(run.run_dir)["counters"]["hub_pid"]), signal.SIGKILL)
    assert run.finish(timeout=420) == 0, run.output()[-3000:]
    assert len(hub_events(run.run_dir, "hub.resumed")) == 5
    assert_accounting(run.run_dir, steps)
    assert_exactly_once(run.run_dir, steps)


def test_an_exception_in_the_hub_restarts_it_and_the_run_completes(
    tmp_path: Path, background_run: list[Run]
) -> None:
    run = Run(tmp_path / "run", STEPS, "--set", "hub.fault_raise_at_step=5")
    background_run.append(run)
    assert run.finish() == 0, run.output()[-3000:]
    assert hub_events(run.run_dir, "hub.crashed") and hub_events(run.run_dir, "hub.resumed")
    assert _steps_recorded_once(run.run_dir) == list(range(1, STEPS + 1))
    assert_exactly_once(run.run_dir, STEPS)


def test_stopped_generator_is_declared_lost_and_recovers(
    tmp_path: Path, background_run: list[Run]
) -> None:
    # paced: generator-0 alone serves every step, and unpaced the run's last 13 steps took
    # 1.1 s once the trainer's step got faster: the hub stopped 3.0 s after the SIGSTOP,
    # before generator-1's 3 s heartbeat deadline had passed
    run = Run(tmp_path / "run", STEPS, "--set", "generator.count=2", *PACED)
    background_run.append(run)
    run.wait_steps(2)
    pid = pid_of(run.run_dir, "generator-1")
    os.kill(pid, signal.SIGSTOP)
    time.sleep(4.5)  # past transport.heartbeat_timeout_s = 3
    os.kill(pid, signal.SIGCONT)
    assert run.finish() == 0, run.output()[-3000:]
    lost = [e for e in hub_events(run.run_dir, "peer.lost") if e["instance"] == "generator-1"]
    assert lost
    assert_accounting(run.run_dir, STEPS)
