"""`up` with hub.payloads = "direct": completions go from the generator to the scorer and the
trainer, the hub carries metadata; the run trains, every group is trained once, and a
generator killed with payloads not yet fetched costs those groups, generated again."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from .conftest import Run, assert_exactly_once, hub_events, metrics, pid_of

pytestmark = pytest.mark.slow
DIRECT = ["--set", "hub.payloads=direct"]


def _events(run_dir: Path, prefix: str, event: str) -> list[dict[str, object]]:
    rows = []
    for path in (run_dir / "logs").glob(f"{prefix}-*.jsonl"):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in rows if r.get("event") == event]


def _balanced(run_dir: Path) -> dict[str, int]:
    counters: dict[str, int] = json.loads((run_dir / "hub" / "counters.json").read_text())
    done = sum(counters[k] for k in ("trained", "filtered", "stale", "failed", "discarded"))
    assert counters["dispatched"] == done + counters["in_progress"], counters
    return counters


def test_a_direct_run_trains_every_group_once(tmp_path: Path, background_run: list[Run]) -> None:
    steps = 8
    run = Run(tmp_path / "run", steps, *DIRECT)
    background_run.append(run)
    assert run.finish() == 0, run.output()[-3000:]
    assert len(metrics(run.run_dir)) == steps
    counters = _balanced(run.run_dir)
    assert counters["requeued_payload"] == 0
    assert_exactly_once(run.run_dir, steps)
    (stopped,) = hub_events(run.run_dir, "hub.stopped")
    assert stopped["rejected"] == {}  # no Rollout reached the hub, nothing was refused
    bound = _events(run.run_dir, "generator", "transport.bound")
    assert [b["socket"] for b in bound] == ["payloads"]  # the generator served its payloads
    assert _events(run.run_dir, "trainer", "payloads.fetch_failed") == []


def test_a_killed_generators_unfetched_groups_are_generated_again(
    tmp_path: Path, background_run: list[Run]
) -> None:
    steps = 16
    # every group is buffered until trained (none filtered), and the trainer pauses 1 s after
    # each step while the generator runs ahead to the staleness gate (2): 0.7 s into a pause its
    # store holds groups the trainer has not fetched (without the pause the generator was the
    # bottleneck, the trainer fetched each group at once and a kill found none held)
    keep = ["--set", "algo.advantage.filter_zero_signal=false", "--set", "trainer.throttle_s=1.0",
            "--set", "hub.max_staleness=2"]  # fmt: skip
    run = Run(tmp_path / "run", steps, *DIRECT, *keep, "--set", "run.restarts=2")
    background_run.append(run)
    run.wait_steps(3)
    time.sleep(0.7)
    os.kill(pid_of(run.run_dir, "generator-0"), signal.SIGKILL)  # its store dies with it
    assert run.finish() == 0, run.output()[-3000:]
    counters = _balanced(run.run_dir)
    lost = hub_events(run.run_dir, "payloads.holder_lost")
    unserved = hub_events(run.run_dir, "payloads.step_unserved")
    assert lost or unserved, "the hub never noticed the lost payloads"
    regenerated = sum(int(e["regenerated"]) for e in lost)
    regenerated += sum(len(e["groups"]) for e in unserved)  # type: ignore[arg-type]
    regenerated += len(hub_events(run.run_dir, "payloads.score_fetch_lost"))
    assert counters["requeued_payload"] == regenerated > 0
    assert_exactly_once(run.run_dir, steps)  # none lost for good, none trained twice
