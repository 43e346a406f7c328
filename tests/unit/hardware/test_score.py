"""HPM score, its refit from throughput reports, work shares and credits."""

from __future__ import annotations

import math

import numpy as np
import pytest
from structlog.testing import capture_logs

from grpo_stream.config.hardware import HardwareSettings
from grpo_stream.hardware.recorded import load_recorded
from grpo_stream.hardware.score import (
    Features,
    ScoreModel,
    Weights,
    credits_for,
    expected_throughput,
    work_shares,
)

NAMES = ["h100-sxm", "a100-40gb-sxm", "rtx-4090", "l4", "t4"]


def _features(name: str, latency_s: float = 0.0) -> Features:
    return Features.of(load_recorded(name), latency_s)


def test_default_score_ranks_datacenter_parts_by_capability():
    model = ScoreModel()
    scores = [model.score(_features(n)) for n in NAMES]
    assert scores == sorted(scores, reverse=True)


def test_latency_lowers_the_score():
    model = ScoreModel()
    assert model.score(_features("l4", 0.005)) < model.score(_features("l4", 0.0))


def test_unknown_features_count_as_zero():
    model = ScoreModel()
    assert model.score(Features(None, None, 0.0)) == 0.0


def _synthetic(model: ScoreModel, truth: Weights, per_device: int, seed: int = 0) -> None:
    """Throughput = truth's prediction x (1 +- 5% noise), with the round trip varying."""
    rng = np.random.default_rng(seed)
    for name in NAMES:
        for _ in range(per_device):
            f = _features(name, float(rng.uniform(0.0005, 0.01)))
            tokens = truth.apply(f.normalised(model.settings)) * float(rng.uniform(0.95, 1.05))
            model.observe(name, f, tokens)


def test_refit_recovers_known_weights_within_20_percent():
    model = ScoreModel()
    truth = Weights(alpha=400.0, beta=900.0, gamma=300.0)
    _synthetic(model, truth, per_device=10)
    result = model.refit()
    assert result.used
    assert max(result.rel_error.values()) < 0.2
    assert result.weights.alpha == pytest.approx(truth.alpha, rel=0.2)
    assert result.weights.beta == pytest.approx(truth.beta, rel=0.2)
    assert result.weights.gamma == pytest.approx(truth.gamma, rel=0.2)


def test_refit_score_predicts_throughput_of_a_device_it_has_not_seen():
    model = ScoreModel()
    truth = Weights(alpha=400.0, beta=900.0, gamma=300.0)
    _synthetic(model, truth, per_device=10)
    model.refit()
    unseen = Features(500.0, 2000.0, 0.001)
    expected = truth.apply(unseen.normalised(model.settings))
    assert model.score(unseen) == pytest.approx(expected, rel=0.2)


def test_too_few_samples_means_no_refit():
    model = ScoreModel(HardwareSettings(refit_min_samples=8))
    for i in range(7):
        model.observe(NAMES[i % 2], _features(NAMES[i % 2]), 1000.0)
    result = model.refit()
    assert not result.used
    assert model.weights == Weights(0.5, 1.0, 1.0)
    assert "not enough data" in result.reason


def test_one_device_is_not_enough_to_refit():
    model = ScoreModel()
    for _ in range(20):
        model.observe("only", _features("l4"), 500.0)
    assert not model.refit().used


def test_refit_is_logged_with_its_error():
    model = ScoreModel()
    _synthetic(model, Weights(100.0, 100.0, 10.0), per_device=4)
    with capture_logs() as logs:
        result = model.refit()
    event = next(e for e in logs if e["event"] == "hpm.refit")
    assert event["used"] is True
    assert event["rmse"] == result.rmse
    assert set(event["rel_error"]) == set(NAMES)


def test_weights_stay_non_negative_when_throughput_falls_with_compute():
    model = ScoreModel()
    for name, tokens in zip(NAMES, [100.0, 200.0, 300.0, 400.0, 500.0], strict=True):
        for _ in range(3):
            model.observe(name, _features(name), tokens)
    result = model.refit()
    assert min(result.weights.alpha, result.weights.beta, result.weights.gamma) >= 0


def test_non_finite_and_negative_reports_are_ignored():
    model = ScoreModel(HardwareSettings(refit_min_samples=1, refit_min_devices=1))
    model.observe("a", _features("l4"), math.nan)
    model.observe("a", _features("l4"), -5.0)
    assert "0 samples" in model.refit().reason


def test_samples_kept_per_device_are_bounded():
    settings = HardwareSettings(max_samples_per_device=4, refit_min_samples=100)
    model = ScoreModel(settings)
    for _ in range(50):
        model.observe("a", _features("l4"), 10.0)
    assert model.refit().samples == 4


def test_shares_sum_to_one():
    shares = work_shares({"a": 3.0, "b": 1.0, "c": 0.5})
    assert sum(shares.values()) == pytest.approx(1.0)


def test_a_device_twice_as_fast_gets_twice_the_share():
    shares = work_shares({"fast": 2000.0, "slow": 1000.0})
    assert shares["fast"] == pytest.approx(2 * shares["slow"])


def test_non_positive_and_nan_scores_get_no_share():
    shares = work_shares({"a": 1.0, "b": -1.0, "c": math.nan})
    assert shares == {"a": 1.0, "b": 0.0, "c": 0.0}


def test_no_positive_score_means_equal_shares():
    assert work_shares({"a": 0.0, "b": -2.0}) == {"a": 0.5, "b": 0.5}


def test_no_scores_means_no_shares():
    assert work_shares({}) == {}


def test_twice_the_share_gets_about_twice_the_credits():
    shares = work_shares({"fast": 2.0, "slow": 1.0})
    fast, slow = (credits_for(shares[k], 16, 2) for k in ("fast", "slow"))
    assert (fast, slow) == (21, 11)


def test_equal_shares_get_the_base_credits():
    assert credits_for(0.25, 16, 4) == 16


def test_credits_are_never_below_one():
    assert credits_for(0.0, 16, 3) == 1


def test_a_share_outside_0_1_is_refused():
    with pytest.raises(ValueError):
        credits_for(1.5, 16, 2)


def test_expected_throughput_prefers_measured_reports():
    model = ScoreModel()
    features = {"a": _features("h100-sxm"), "b": _features("l4")}
    assert expected_throughput(model, features, {"a": 1234.0})["a"] == 1234.0


def test_unmeasured_devices_are_scaled_to_the_measured_units_before_a_refit():
    model = ScoreModel()
    features = {"a": _features("h100-sxm"), "b": _features("l4")}
    out = expected_throughput(model, features, {"a": 1000.0})
    ratio = model.score(features["b"]) / model.score(features["a"])
    assert out["b"] == pytest.approx(1000.0 * ratio)


def test_without_reports_expected_throughput_is_the_score():
    model = ScoreModel()
    features = {"b": _features("l4")}
    assert expected_throughput(model, features, {}) == {"b": model.score(features["b"])}


def test_a_refit_that_cannot_run_is_said_once_then_at_debug():
    model = ScoreModel()
    with capture_logs() as logs:
        for _ in range(3):
            model.refit()
    levels = [e["log_level"] for e in logs if e["event"] == "hpm.refit"]
    assert levels == ["info", "debug", "debug"]


def test_refit_splits_a_misfit_the_features_cannot_express_in_relative_error():
    # two devices whose features say 3x apart, measured 2.2x apart (contention): with the
    # predictions' ratio fixed at 3, least squares in relative error (a = S / y_fast,
    # q = y_fast / (3 y_slow)) minimises (a - 1)^2 + (a q - 1)^2: a = (1 + q) / (1 + q^2)
    model = ScoreModel(HardwareSettings(refit_min_samples=2))
    for _ in range(5):
        model.observe("fast", Features(30.0, 300.0), 220.0)
        model.observe("slow", Features(10.0, 100.0), 100.0)
    result = model.refit()
    q = 220.0 / (3 * 100.0)
    a = (1 + q) / (1 + q * q)
    assert result.used
    assert result.rel_error["fast"] == pytest.approx(abs(a - 1), abs=1e-3)
    assert result.rel_error["slow"] == pytest.approx(abs(a * q - 1), abs=1e-3)
    assert result.measured == pytest.approx({"fast": 220.0, "slow": 100.0})
    # the features fix the predictions' ratio at 3; the fit scales them to a = S / y_fast
    assert result.predicted["fast"] / result.predicted["slow"] == pytest.approx(3.0, rel=1e-3)
    assert result.predicted["fast"] == pytest.approx(a * 220.0, rel=1e-3)
