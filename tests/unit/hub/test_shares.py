"""The hub's share book: fingerprints, measured throughput and hub round trips per generator."""

from __future__ import annotations

import math

from grpo_stream.config.hardware import HardwareSettings
from grpo_stream.hardware.fingerprint import fingerprint_host
from grpo_stream.hardware.recorded import RecordedNvml, load_record
from grpo_stream.hub.shares import ShareBook


def book() -> ShareBook:
    """Two generators on the same recorded GPU (an L4)."""
    l4 = fingerprint_host(nvml=RecordedNvml([load_record("l4")])).to_dict()
    shares = ShareBook(HardwareSettings())
    shares.join("near", l4)
    shares.join("far", l4)
    return shares


def test_a_measured_round_trip_becomes_the_latency_feature_and_lowers_the_score() -> None:
    shares = book()
    assert shares.features["near"].tflops  # the recorded device is understood
    shares.report_latency("far", 0.005)
    assert shares.features["far"].latency_s == 0.005
    assert shares.features["near"].latency_s == 0.0
    near = shares.model.score(shares.features["near"])
    far = shares.model.score(shares.features["far"])
    assert far < near  # gamma > 0 by default: a longer round trip scores lower
    got = shares.shares(["near", "far"])
    assert got["near"] > got["far"] and math.isclose(sum(got.values()), 1.0)


def test_bad_or_unknown_round_trips_are_ignored() -> None:
    shares = book()
    for bad in (float("nan"), -1.0, "fast", None):
        shares.report_latency("near", bad)
    shares.report_latency("nobody", 0.1)
    assert shares.features["near"].latency_s == 0.0 and "nobody" not in shares.features


def test_an_unmeasured_generator_rated_zero_gets_a_share_beside_a_measured_one() -> None:
    """A CPU device scores <= 0 under the default weights; beside a measured generator a zero
    share would never be first to finish, so it would never be measured (test_shares'
    starved slow generator). It counts as fast as the slowest rated one until measured."""
    cpu = {"source": "cpu", "devices": [{"kind": "cpu", "name": "cpu", "index": 0, "host": "h",
           "cpu_cores": 2, "fp32_tflops": 0.05, "memory_bandwidth_gbps": 5.0}]}  # fmt: skip
    shares = ShareBook(HardwareSettings())
    shares.join("measured", cpu)
    shares.join("new", cpu)
    shares.report_latency("new", 0.01)
    assert shares.model.score(shares.features["new"]) <= 0  # the model cannot rate it
    shares.report("measured", 150.0)
    assert shares.shares(["measured", "new"]) == {"measured": 0.5, "new": 0.5}
    shares.report("new", 50.0)  # once measured, its own speed
    assert shares.shares(["measured", "new"]) == {"measured": 0.75, "new": 0.25}
