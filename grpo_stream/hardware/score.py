"""The hardware performance score, its refit from measured throughput, and work shares.

    HPM = alpha * F + beta * B - gamma * L
    F = compute TFLOPS / flops_ref_tflops      (bf16 tensor peak; CPU: measured matmul)
    B = memory GB/s / bandwidth_ref_gbps       (datasheet-grade estimate; CPU: measured copy)
    L = hub round trip seconds / latency_ref_s (measured by the caller)

Normalisation is against fixed, documented reference values (HardwareSettings), not
across the devices present: a device's features never change when another device joins,
so throughput samples taken at different times stay comparable and the refit is sound.
An unknown feature counts as 0.

Before any refit the weights are the defaults and the score is in arbitrary units; after
a refit it predicts tokens/s. Only ratios matter for shares, so both are usable.

Invariants: weights are never negative (the refit is box-constrained to
[0, weight_max]); a refit happens only with >= refit_min_samples reports from
>= refit_min_devices devices and is rejected when it predicts zero for every device;
`work_shares` always sums to 1 (equal shares when no score is positive); `credits_for` is
always >= 1, so no generator is starved.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import structlog

from grpo_stream.config.hardware import HardwareSettings
from grpo_stream.hardware.device import DeviceFingerprint
from grpo_stream.hardware.nnls import bounded_lstsq

log = structlog.get_logger()

Vector = tuple[float, float, float]


@dataclass(frozen=True)
class Features:
    """Raw (unnormalised) inputs of the score for one device."""

    tflops: float | None
    bandwidth_gbps: float | None
    latency_s: float = 0.0

    @classmethod
    def of(cls, device: DeviceFingerprint, latency_s: float = 0.0) -> Features:
        return cls(device.compute_tflops, device.memory_bandwidth_gbps, latency_s)

    def normalised(self, settings: HardwareSettings) -> Vector:
        """(F, B, L) against the reference values; unknown counts as 0."""
        f = (self.tflops or 0.0) / settings.flops_ref_tflops
        b = (self.bandwidth_gbps or 0.0) / settings.bandwidth_ref_gbps
        return f, b, max(self.latency_s, 0.0) / settings.latency_ref_s


@dataclass(frozen=True)
class Weights:
    alpha: float
    beta: float
    gamma: float

    def apply(self, x: Vector) -> float:
        return self.alpha * x[0] + self.beta * x[1] - self.gamma * x[2]


@dataclass(frozen=True)
class FitResult:
    """What a refit found. `used` says whether the model now scores with `weights`."""

    weights: Weights
    rmse: float | None
    rel_error: dict[str, float] = field(default_factory=dict)
    used: bool = False
    reason: str = ""
    samples: int = 0
    devices: int = 0
    # each device's mean measured tokens/s, and what the weights predict for it
    measured: dict[str, float] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)


class ScoreModel:
    """Scores devices, collects their measured tokens/s, and refits the weights to predict it."""

    def __init__(self, settings: HardwareSettings | None = None) -> None:
        self.settings = settings or HardwareSettings()
        s = self.settings
        self.weights = Weights(s.alpha, s.beta, s.gamma)
        self.fitted = False
        self._samples: dict[str, deque[tuple[Vector, float]]] = {}
        self._said_unfit = False  # a refit that cannot run is said once, then at debug

    def score(self, features: Features) -> float:
        """HPM of one device (tokens/s once refit, arbitrary units before)."""
        return self.weights.apply(features.normalised(self.settings))

    def observe(self, device_id: str, features: Features, tokens_per_s: float) -> None:
        """Record one throughput report; non-finite or negative reports are ignored."""
        if not math.isfinite(tokens_per_s) or tokens_per_s < 0:
            log.warning("hpm.observe_rejected", device=device_id, tokens_per_s=tokens_per_s)
            return
        maxlen = self.settings.max_samples_per_device
        samples = self._samples.setdefault(device_id, deque(maxlen=maxlen))
        samples.append((features.normalised(self.settings), float(tokens_per_s)))

    def refit(self) -> FitResult:
        """Fit alpha, beta, gamma to the reports (bounded least squares) when there are enough."""
        n = sum(len(v) for v in self._samples.values())
        devices = sum(1 for v in self._samples.values() if v)
        s = self.settings
        if n < s.refit_min_samples or devices < s.refit_min_devices:
            reason = (
                f"not enough data: {n} samples from {devices} devices "
                f"(need {s.refit_min_samples} from {s.refit_min_devices})"
            )
            return self._log(FitResult(self.weights, None, {}, False, reason, n, devices))
        weights = self._fit()
        rmse, rel, measured, predicted = self._errors(weights)
        if not any(weights.apply(x) > 0 for v in self._samples.values() for x, _ in v):
            result = FitResult(
                self.weights, rmse, rel, False, "degenerate fit", n, devices, measured, predicted
            )
            return self._log(result)
        self.weights, self.fitted = weights, True
        return self._log(
            FitResult(weights, rmse, rel, True, "fit", n, devices, measured, predicted)
        )

    def _fit(self) -> Weights:
        """Least squares in relative error: each device's rows are divided by its mean
        throughput. Shares are ratios of predictions, so a prediction's error for them is
        relative; in absolute tokens/s the slowest device's misfit would count least (a
        device at a third of another's speed, 3x under-weighted), and when the features
        cannot express the measured speed ratio its relative error would take all of it."""
        rows, targets = [], []
        means = {k: sum(y for _, y in v) / len(v) for k, v in self._samples.items() if v}
        positive = [m for m in means.values() if m > 0]
        fallback = sum(positive) / len(positive) if positive else 1.0
        for device, samples in self._samples.items():
            if not samples:
                continue
            scale = means[device] if means[device] > 0 else fallback
            # every device counts equally, however chatty and however fast
            w = 1.0 / (math.sqrt(len(samples)) * scale)
            for (f, b, lat), y in samples:
                rows.append((w * f, w * b, -w * lat))
                targets.append(w * y)
        upper = np.full(3, self.settings.weight_max)
        x = bounded_lstsq(np.array(rows), np.array(targets), upper)
        return Weights(float(x[0]), float(x[1]), float(x[2]))

    def _errors(
        self, weights: Weights
    ) -> tuple[float, dict[str, float], dict[str, float], dict[str, float]]:
        """RMSE over all samples; per device, the relative error of its mean prediction, its
        mean measured and its mean predicted tokens/s."""
        sq, count = 0.0, 0
        rel: dict[str, float] = {}
        measured: dict[str, float] = {}
        predicted: dict[str, float] = {}
        for device, samples in self._samples.items():
            preds = [weights.apply(x) for x, _ in samples]
            obs = [y for _, y in samples]
            sq += sum((p - o) ** 2 for p, o in zip(preds, obs, strict=True))
            count += len(obs)
            mean_obs = sum(obs) / len(obs)
            mean_pred = sum(preds) / len(preds)
            rel[device] = abs(mean_pred - mean_obs) / mean_obs if mean_obs > 0 else math.inf
            measured[device], predicted[device] = mean_obs, mean_pred
        return math.sqrt(sq / count), rel, measured, predicted

    def _log(self, result: FitResult) -> FitResult:
        w = result.weights
        level = log.info
        if not result.used:
            level = log.debug if self._said_unfit else log.info
            self._said_unfit = True
        level(
            "hpm.refit",
            used=result.used,
            reason=result.reason,
            alpha=w.alpha,
            beta=w.beta,
            gamma=w.gamma,
            rmse=result.rmse,
            rel_error=result.rel_error,
            measured=result.measured,
            predicted=result.predicted,
            samples=result.samples,
            devices=result.devices,
        )
        return result


def expected_throughput(
    model: ScoreModel, features: dict[str, Features], measured: dict[str, float]
) -> dict[str, float]:
    """Tokens/s per device for `work_shares`: measured where reported, else predicted.

    Before a refit the score is in arbitrary units, so predictions are rescaled by
    (sum measured / sum predicted) over the devices that reported, keeping measured and
    predicted devices comparable. Without any report the plain scores are returned.
    """
    good = {k: v for k, v in measured.items() if k in features and math.isfinite(v) and v >= 0}
    predicted = {k: model.score(f) for k, f in features.items()}
    scale = 1.0
    if good and not model.fitted:
        denominator = sum(max(predicted[k], 0.0) for k in good)
        scale = sum(good.values()) / denominator if denominator > 0 else 1.0
    return {k: good[k] if k in good else predicted[k] * scale for k in features}


def work_shares(scores: dict[str, float]) -> dict[str, float]:
    """Each device's share of the work, proportional to its (positive part of the) score.

    Non-finite or non-positive scores get 0; when none is positive the shares are equal.
    The shares sum to 1 (an empty input gives an empty output).
    """
    if not scores:
        return {}
    clean = {k: v if math.isfinite(v) and v > 0 else 0.0 for k, v in scores.items()}
    total = sum(clean.values())
    if total <= 0:
        return {k: 1.0 / len(clean) for k in clean}
    return {k: v / total for k, v in clean.items()}


def credits_for(share: float, base_credits: int, n_generators: int) -> int:
    """Prompts a generator may hold: base_credits when shares are equal, scaled by share.

    round(share x base_credits x n_generators), at least 1.
    """
    if not 0 <= share <= 1 or not math.isfinite(share):
        raise ValueError(f"share must be in [0, 1], got {share}")
    if base_credits < 1 or n_generators < 1:
        raise ValueError("base_credits and n_generators must be >= 1")
    return max(1, round(share * base_credits * n_generators))
