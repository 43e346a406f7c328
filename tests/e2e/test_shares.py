"""Work shares follow measured speed: two real CPU generators, one throttled to a third of the
other's speed; their dispatched prompts converge to their speed ratio, and the refit score
model predicts each one's throughput."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from grpo_stream.launch.supervisor import ServiceSpec, Supervisor

# its own waits (the hub's start, the trainer's 400 s) bound it, not the suite's 300 s default:
# on a loaded 2-core machine the 120 steps took 320 s once
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SETTINGS = [
    "run.max_steps=120",
    "hub.groups_per_step=8",
    "generator.group_size=4",
    "generator.prompts_per_request=4",
    "transport.heartbeat_interval_s=0.5",
    "transport.heartbeat_timeout_s=5.0",
    "hardware.refit_min_samples=8",
    # generation, not the trainer, must be the bottleneck, or dispatch follows what work there
    # is rather than speed: with the trainer's step at 0.04 s (shared prompts) and 8-token
    # completions both generators computed ~25% of the run and the fast one got 0.75-0.8 of
    # its speed ratio, failing 5 runs of 5 on a quiet machine; with these 5 of 5 passed
    "generator.max_tokens=32",
    "hub.max_staleness=2",
]


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "grpo_stream.cli.main", "run", *args, "--log-json"]


def _hub_event(run_dir: Path, name: str) -> list[dict[str, object]]:
    lines = (run_dir / "logs" / "grouper-grouper-0.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == name]


def test_dispatch_follows_speed_and_refit_predicts_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sets = [a for s in [*SETTINGS, f'run.run_dir="{run_dir}"'] for a in ("--set", s)]
    sup = Supervisor()
    try:
        sup.start(
            ServiceSpec("grouper-0", "grouper", _argv("grouper", "--instance", "grouper-0", *sets))
        )
        addr = run_dir / "hub.addr"
        deadline = time.monotonic() + 60
        while not (addr.exists() and addr.read_text().strip()):
            assert time.monotonic() < deadline, "hub did not start"
            time.sleep(0.1)
        hub = addr.read_text().strip()
        for name, extra in [
            ("trainer-0", []),
            ("scorer-0", []),
            ("generator-fast", []),
            ("generator-slow", ["--throttle", "3"]),
        ]:
            service = name.split("-")[0]
            sup.start(
                ServiceSpec(name, service, _argv(service, "--instance", name, "--hub", hub, *extra))
            )
        trainer = sup.procs["trainer-0"].popen
        assert trainer.wait(timeout=400) == 0
    finally:
        sup.stop_all()
    stopped = _hub_event(run_dir, "hub.stopped")[-1]
    dispatched = stopped["dispatched_to"]
    rates = stopped["tokens_per_s"]
    assert isinstance(dispatched, dict) and isinstance(rates, dict)
    fast, slow = "generator-fast", "generator-slow"
    speed_ratio = rates[fast] / rates[slow]
    share_ratio = dispatched[fast] / dispatched[slow]
    assert speed_ratio > 1.5  # the throttle really slowed one down
    fits = [e for e in _hub_event(run_dir, "hpm.refit") if e["used"]]
    assert fits, "the score model was never refit"
    fit = fits[-1]
    errors, measured, predicted = fit["rel_error"], fit["measured"], fit["predicted"]
    assert isinstance(errors, dict) and isinstance(measured, dict)
    assert isinstance(predicted, dict)
    # the hub has two measures of the speed ratio: its throughput estimate at the end
    # (`speed_ratio`) and the refit's mean of the reports; in runs of 2026-12-03 they
    # differed by up to 39% (1.96 against 2.73), and the shares (2.24-2.32) fell between
    # them but up to 19% from the first. Dispatch follows speed if its ratio lies within
    # 15% of the range the two span (equal shares, 1.0, fail it)
    measured_ratio = measured[fast] / measured[slow]
    seen = sorted([speed_ratio, measured_ratio])
    assert 0.85 * seen[0] <= share_ratio <= 1.15 * seen[1], (share_ratio, seen)
    # both fingerprints are the same CPU, the slow one's scaled by 1/3: the score's features
    # put the predictions' ratio at 3 unless the latency term takes up the difference, while
    # contention moves the measured ratio (2.02-2.05 in the 2 of 10 runs of 2026-12-03 where
    # a fixed 20% bound failed). Whatever ratio r_p the fit predicts, relative least squares
    # over the two devices' means scales its predictions to a = (1 + q) / (1 + q^2) of the
    # fast one's measurement, q = measured ratio / r_p, leaving errors |a - 1| and |a q - 1|
    # (the closed form of tests/unit/hardware/test_score.py's misfit test); a fit in
    # absolute tokens/s would load the whole misfit on the slow device and fail this.
    q = measured_ratio / (predicted[fast] / predicted[slow])
    a = (1 + q) / (1 + q * q)
    best = max(abs(a - 1), abs(a * q - 1))
    assert max(errors.values()) <= best + 0.05, (errors, best, measured, predicted)
    # and where the measured ratio is one the features at 3 can meet within 20% (2.10-4.28),
    # the refit does
    if 2.10 <= measured_ratio <= 4.28:
        assert max(errors.values()) <= 0.20, (errors, measured, predicted)
