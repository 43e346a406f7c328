"""scorer.workers: a number as set; auto from what `up` planned, else the cores, within
1..groups_per_request."""

from __future__ import annotations

from grpo_stream.rewards.sizing import ENV_WORKERS, resolve_workers, spare_share


def test_a_number_is_taken_as_set() -> None:
    assert resolve_workers(3, 2, {ENV_WORKERS: "7"}, cores=16) == 3


def test_auto_takes_the_share_up_planned() -> None:
    assert resolve_workers("auto", 8, {ENV_WORKERS: "3"}, cores=16) == 3


def test_auto_without_a_plan_takes_the_cores() -> None:
    assert resolve_workers("auto", 8, {}, cores=5) == 5


def test_auto_never_exceeds_the_groups_a_scorer_holds() -> None:
    assert resolve_workers("auto", 8, {}, cores=64) == 8
    assert resolve_workers("auto", 2, {ENV_WORKERS: "6"}, cores=64) == 2


def test_the_spare_share_is_at_least_one_worker() -> None:
    assert spare_share(cores=2, torch_threads=2, scorers=1) == 1
    assert spare_share(cores=10, torch_threads=2, scorers=3) == 2
    assert spare_share(cores=4, torch_threads=1, scorers=0) == 3


def test_auto_runs_one_worker_for_a_reward_that_loads_a_model() -> None:
    assert resolve_workers("auto", 8, {ENV_WORKERS: "6"}, cores=16, learned=True) == 1
    assert resolve_workers(3, 8, {}, cores=16, learned=True) == 3
