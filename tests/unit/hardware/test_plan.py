"""Role plans: the trainer gets the most memory, generators share by score."""

from __future__ import annotations

import json

import pytest

from grpo_stream.config.hardware import HardwareSettings
from grpo_stream.hardware.plan import PlanError, plan_roles
from grpo_stream.hardware.recorded import load_recorded


def _cluster(*names: str):
    return [load_recorded(n, host=f"h{i}", index=0) for i, n in enumerate(names)]


MIXED = ("l4", "a100-40gb-sxm", "t4", "h100-sxm", "rtx-4090")


def test_trainer_gets_the_device_with_the_most_memory():
    plan = plan_roles(_cluster(*MIXED), model_params=1_500_000_000)
    assert [a.name for a in plan.trainer] == ["NVIDIA H100 80GB HBM3"]


def test_generator_shares_are_ordered_by_score_and_sum_to_one():
    plan = plan_roles(_cluster(*MIXED), model_params=1_500_000_000)
    scores = [a.score for a in plan.generators]
    shares = [a.share for a in plan.generators]
    assert scores == sorted(scores, reverse=True)
    assert shares == sorted(shares, reverse=True)
    assert sum(shares) == pytest.approx(1.0)
    assert plan.generators[0].name == "NVIDIA A100-SXM4-40GB"


def test_every_device_has_exactly_one_role():
    plan = plan_roles(_cluster(*MIXED), model_params=1_500_000_000)
    ids = [a.device_id for a in plan.trainer + plan.generators + plan.idle]
    assert sorted(ids) == sorted(f"h{i}:0" for i in range(len(MIXED)))


def test_the_a100_trains_when_it_is_the_largest_device():
    plan = plan_roles(_cluster("l4", "a100-40gb-sxm", "t4"), model_params=1_000_000_000)
    assert plan.trainer[0].name == "NVIDIA A100-SXM4-40GB"


def test_a_model_too_large_for_every_device_is_an_error():
    with pytest.raises(PlanError, match="trainer needs 1 device"):
        plan_roles(_cluster(*MIXED), model_params=7_000_000_000)


def test_sharded_trainer_splits_the_state_and_small_devices_idle():
    settings = HardwareSettings(trainer_sharded=True)
    plan = plan_roles(
        _cluster("h100-sxm", "h100-sxm", "l4", "t4"), 7_000_000_000, 2, settings=settings
    )
    assert [a.device_id for a in plan.trainer] == ["h0:0", "h1:0"]
    assert [a.name for a in plan.generators] == ["NVIDIA L4"]
    assert [a.name for a in plan.idle] == ["Tesla T4"]
    assert "GiB to generate" in plan.idle[0].reason


def test_a_single_device_trains_and_generates():
    plan = plan_roles(_cluster("h100-sxm"), model_params=500_000_000)
    assert plan.colocated
    assert plan.generators[0].device_id == plan.trainer[0].device_id
    assert plan.generators[0].share == 1.0


def test_latency_lowers_a_generators_share():
    devices = _cluster("h100-sxm", "l4", "l4")
    plan = plan_roles(devices, 1_000_000_000, latency_s={"h2:0": 0.002})
    shares = {a.device_id: a.share for a in plan.generators}
    assert shares["h2:0"] < shares["h1:0"]


def test_each_generator_gets_credits_proportional_to_its_share():
    plan = plan_roles(_cluster(*MIXED), model_params=1_500_000_000, base_credits=16)
    n = len(plan.generators)
    for a in plan.generators:
        assert a.credits == max(1, round(a.share * 16 * n))


def test_plan_is_json_serialisable():
    plan = plan_roles(_cluster(*MIXED), model_params=1_500_000_000)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["trainer"][0]["device_id"] == plan.trainer[0].device_id
    assert len(data["generators"]) == 4


def test_no_devices_is_an_error():
    with pytest.raises(PlanError, match="no devices"):
        plan_roles([], model_params=1000)
