"""Generators' shares of the work, from their devices and what they actually deliver.

Each generator's Hello carries its host fingerprint (NVML GPUs or the CPU); its heartbeats
report tokens/s and its measured hub round trip (the score's latency term). The hardware
score model (`grpo_stream.hardware.score`) turns fingerprints into predicted throughput, is
refit from the reports, and `work_shares` turns throughputs into shares that sum to 1. The
dispatcher (`grpo_stream.hub.dispatch`) treats shares as speeds, so a device twice as fast
holds and gets about twice the prompts. A malformed fingerprint counts as an unknown device;
it never fails the hub.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import structlog

from grpo_stream.config.hardware import HardwareSettings
from grpo_stream.hardware.device import HostFingerprint
from grpo_stream.hardware.score import (
    Features,
    FitResult,
    ScoreModel,
    expected_throughput,
    work_shares,
)

log = structlog.get_logger()


def features_of(fingerprint: dict[str, Any]) -> Features:
    """Score features of the first device of a Hello's fingerprint (unknown if malformed)."""
    try:
        host = HostFingerprint.from_dict(fingerprint)
    except (KeyError, TypeError, ValueError, AttributeError):
        return Features(None, None)
    if not host.devices:
        return Features(None, None)
    return Features.of(host.devices[0])


class ShareBook:
    """Features and measured throughput per generator instance; shares; periodic refit."""

    def __init__(self, settings: HardwareSettings, refit_every_s: float = 10.0) -> None:
        self.model = ScoreModel(settings)
        self.features: dict[str, Features] = {}
        self.measured: dict[str, float] = {}
        self.refit_every_s = refit_every_s
        self._next_refit = 0.0
        self.last_fit: FitResult | None = None

    def join(self, instance: str, fingerprint: dict[str, Any]) -> None:
        self.features[instance] = features_of(fingerprint)

    def report_latency(self, instance: str, hub_rtt_s: object) -> None:
        """A generator's measured hub round trip becomes its latency feature."""
        if instance not in self.features or not isinstance(hub_rtt_s, (int, float)):
            return
        rtt = float(hub_rtt_s)
        if math.isfinite(rtt) and rtt >= 0:
            self.features[instance] = replace(self.features[instance], latency_s=rtt)

    def report(self, instance: str, tokens_per_s: object) -> None:
        if instance not in self.features or not isinstance(tokens_per_s, (int, float)):
            return
        rate = float(tokens_per_s)
        if math.isfinite(rate) and rate > 0:
            self.measured[instance] = rate
            self.model.observe(instance, self.features[instance], rate)

    def shares(self, instances: list[str]) -> dict[str, float]:
        """Each generator's share. One not yet measured whose device the score model cannot
        rate (a score <= 0: e.g. a CPU, whose latency term outweighs its FLOPs) counts as
        fast as the slowest rated one, so it gets work and its speed gets measured; at 0 it
        would never be first to finish beside a measured generator, and so never measured."""
        feats = {i: self.features.get(i, Features(None, None)) for i in instances}
        measured = {i: v for i, v in self.measured.items() if i in feats}
        speeds = expected_throughput(self.model, feats, measured)
        rated = [v for v in speeds.values() if math.isfinite(v) and v > 0]
        if rated:
            floor = min(rated)
            for i, v in speeds.items():
                if i not in measured and not (math.isfinite(v) and v > 0):
                    speeds[i] = floor
        return work_shares(speeds)

    def maybe_refit(self, now: float) -> FitResult | None:
        if now < self._next_refit:
            return None
        self._next_refit = now + self.refit_every_s
        self.last_fit = self.model.refit()
        return self.last_fit
