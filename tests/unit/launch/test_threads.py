"""Torch threads per service: the split of a machine's cores, and the plan reaching a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from grpo_stream.config import ConfigError, load_config
from grpo_stream.launch import placed, threads
from grpo_stream.launch.placement import Placement, Slot
from grpo_stream.launch.supervisor import ServiceSpec
from grpo_stream.launch.threads import (
    measured_shares,
    service_plans,
    size_scorers,
    size_specs,
    split_cores,
)
from grpo_stream.rewards.sizing import ENV_WORKERS
from grpo_stream.threads import ENV_CPUS, ENV_THREADS, ThreadPlan, plan_from_env

EQUAL = {"trainer": 1.0, "generator": 1.0}


def test_two_busy_services_on_two_cores_get_one_thread_each_unpinned() -> None:
    plans = split_cores([0, 1], ["trainer", "generator"], EQUAL)
    assert plans == [ThreadPlan(1), ThreadPlan(1)]


def test_services_with_a_pool_are_pinned_to_disjoint_cores() -> None:
    plans = split_cores([0, 1, 2, 3], ["trainer", "generator"], EQUAL)
    assert plans == [ThreadPlan(2, cpus=(0, 1)), ThreadPlan(2, cpus=(2, 3))]


def test_cores_split_in_proportion_to_busy_shares() -> None:
    plans = split_cores(list(range(8)), ["trainer", "generator"], {"trainer": 3, "generator": 1})
    assert [p.threads for p in plans] == [6, 2]
    assert [p.cpus for p in plans] == [(0, 1, 2, 3, 4, 5), (6, 7)]


def test_every_core_is_given_once_and_each_service_gets_one() -> None:
    shares = {"trainer": 1.0, "generator": 0.01, "evaluator": 0.01}
    plans = split_cores([4, 5, 6, 7, 8], ["trainer", "generator", "generator", "evaluator"], shares)
    assert [p.threads for p in plans] == [2, 1, 1, 1]
    cpus = [c for p in plans for c in p.cpus]
    assert sorted(cpus) == [4, 5, 6, 7, 8]


def test_more_services_than_cores_run_one_thread_each_unpinned() -> None:
    plans = split_cores([0, 1], ["trainer", "generator", "generator"], EQUAL)
    assert plans == [ThreadPlan(1)] * 3


def test_busy_shares_are_measured_from_the_waits_in_the_metrics() -> None:
    rows = [
        {"wall_time": 10.0, "trainer_wait_s": 5.0, "gen_wait_s": 1.0},
        {"wall_time": 14.0, "trainer_wait_s": 1.0, "gen_wait_s": 3.0},
        {"wall_time": 20.0, "trainer_wait_s": 2.0, "gen_wait_s": 5.0},
    ]
    # trainer waited 3 of 10 s; the two generators 4 of their 2 x 10 s
    assert measured_shares(rows, generators=2) == pytest.approx({"trainer": 0.7, "generator": 0.8})


def test_a_lone_step_measures_nothing() -> None:
    assert measured_shares([{"wall_time": 1.0, "trainer_wait_s": 0, "gen_wait_s": 0}], 1) == {}


def test_a_number_gives_every_torch_service_that_many_threads() -> None:
    plans = service_plans(3, ["trainer", "generator", "scorer", "evaluator"], cores=[0, 1])
    assert plans == [ThreadPlan(3), ThreadPlan(3), None, ThreadPlan(3)]


def test_auto_leaves_hub_and_scorers_alone() -> None:
    plans = service_plans("auto", ["scorer", "trainer", "grouper", "generator"], cores=[0, 1, 2, 3])
    assert plans == [None, ThreadPlan(2, cpus=(0, 1)), None, ThreadPlan(2, cpus=(2, 3))]


def test_a_service_up_did_not_size_uses_every_core_it_has() -> None:
    assert plan_from_env("auto", {}).threads == len(os.sched_getaffinity(0))
    assert plan_from_env(2, {}) == ThreadPlan(2)


def test_bad_torch_threads_is_one_line_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"^invalid config: run\.torch_threads: .*'fast'$"):
        load_config(None, ['run.torch_threads="fast"'])
    with pytest.raises(ConfigError, match=r"run\.torch_threads"):
        load_config(None, ["run.torch_threads=0"])


def test_auto_gives_trainer_and_generator_disjoint_cores_in_their_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threads, "local_cores", lambda: [0, 1, 2, 3])  # the machine's affinity
    cfg = load_config(None, ['run.torch_threads="auto"', "generator.count=1"])
    placement = Placement("none", (Slot("local"),), (Slot("local"),))
    specs = {s.service: s for s in placed.placed_specs(cfg, placement, "tcp://h:1", False)}
    trainer, generator = specs["trainer"].env, specs["generator"].env
    assert trainer[ENV_CPUS] and generator[ENV_CPUS]
    assert not set(trainer[ENV_CPUS].split(",")) & set(generator[ENV_CPUS].split(","))
    assert trainer["OMP_NUM_THREADS"] == trainer[ENV_THREADS]
    assert ENV_THREADS not in specs["scorer"].env


def test_a_trainer_node_of_two_ranks_pins_both_to_its_cores() -> None:
    trainer = ServiceSpec("trainer-0", "trainer", ["torchrun"])
    generator = ServiceSpec("generator-0", "generator", ["gen"])
    size_specs("auto", [(trainer, 2), (generator, 1)], cores=list(range(6)))
    assert trainer.env[ENV_THREADS] == "2" and trainer.env[ENV_CPUS] == "0,1,2,3"
    assert generator.env[ENV_THREADS] == "2" and generator.env[ENV_CPUS] == "4,5"


def _services(*kinds: str) -> list[tuple[ServiceSpec, int]]:
    return [(ServiceSpec(f"{kind}-{i}", kind, [kind]), 1) for i, kind in enumerate(kinds)]


def test_scorers_share_the_cores_the_torch_threads_leave() -> None:
    specs = _services("trainer", "generator", "scorer", "scorer")
    size_scorers("auto", 1, specs, cores=list(range(8)))
    assert [spec.env.get(ENV_WORKERS) for spec, _ in specs] == [None, None, "3", "3"]


def test_a_scorer_gets_one_worker_where_torch_takes_every_core() -> None:
    specs = _services("trainer", "generator", "scorer")
    size_scorers("auto", 1, specs, cores=[0, 1])
    assert specs[2][0].env[ENV_WORKERS] == "1"


def test_scorer_sizing_counts_the_planned_threads_of_each_trainer_rank() -> None:
    trainer = ServiceSpec("trainer-0", "trainer", ["torchrun"], env={ENV_THREADS: "2"})
    scorer = ServiceSpec("scorer-0", "scorer", ["scorer"])
    size_scorers("auto", "auto", [(trainer, 2), (scorer, 1)], cores=list(range(6)))
    assert scorer.env[ENV_WORKERS] == "2"


def test_a_number_of_scorer_workers_is_left_to_the_config() -> None:
    specs = _services("trainer", "scorer")
    size_scorers(3, 1, specs, cores=list(range(8)))
    assert ENV_WORKERS not in specs[1][0].env


def test_up_plans_its_scorers_workers_from_the_machines_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threads, "local_cores", lambda: [0, 1, 2, 3, 4, 5])
    cfg = load_config(None, ["generator.count=1"])
    placement = Placement("none", (Slot("local"),), (Slot("local"),))
    specs = {s.service: s for s in placed.placed_specs(cfg, placement, "tcp://h:1", False)}
    assert specs["scorer"].env[ENV_WORKERS] == "4"  # 6 cores, trainer and generator 1 each


CHILD = """
import json, os
from grpo_stream import threads
threads.pin_from_env(os.environ)
threads.set_torch_threads(threads.plan_from_env("auto", os.environ))
print(json.dumps(threads.current()))
"""


def test_the_plan_reaches_a_started_process() -> None:
    cpu = max(os.sched_getaffinity(0))
    env = {**os.environ, **ThreadPlan(threads=2, cpus=(cpu,)).env()}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == {"threads": 2, "interop": 1, "cpus": [cpu]}
