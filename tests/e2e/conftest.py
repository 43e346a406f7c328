"""Helpers for end-to-end tests: run `grpo-stream up` in the background, query the hub,
read the run directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

SMALL = [
    "--set",
    "hub.groups_per_step=4",
    "--set",
    "generator.group_size=4",
    "--set",
    "generator.prompts_per_request=4",
]
"""Small steps: 4 groups of 4 completions."""
FAST = [
    *SMALL,
    "--set",
    "transport.heartbeat_interval_s=0.5",
    "--set",
    "transport.heartbeat_timeout_s=3.0",
    "--set",
    "hub.checkpoint_every_s=1.0",
]


def up_command(run_dir: Path, steps: int, *extra: str, settings: list[str] = FAST) -> list[str]:
    """`grpo-stream up` for `steps` steps; `settings` default to small steps with short
    heartbeat deadlines (FAST)."""
    return [
        sys.executable,
        "-m",
        "grpo_stream.cli.main",
        "up",
        "--run-dir",
        str(run_dir),
        "--max-steps",
        str(steps),
        *settings,
        *extra,
    ]


class Run:
    """A `grpo-stream up` process in the background."""

    def __init__(self, run_dir: Path, steps: int, *extra: str) -> None:
        self.run_dir = run_dir
        self.log = (run_dir.parent / f"{run_dir.name}.up.log").open("w")
        self.proc = subprocess.Popen(
            up_command(run_dir, steps, *extra),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_steps(self, n: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(metrics(self.run_dir)) >= n:
                return
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"up exited early ({self.proc.returncode}): {self.output()[-2000:]}"
                )
            time.sleep(0.2)
        raise AssertionError(f"no {n} steps in {timeout}s: {self.output()[-2000:]}")

    def finish(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.log.close()

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def kill(self) -> None:
        """Stop `up` as a user would (SIGTERM: it stops its services), SIGKILL if it hangs."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def status(run_dir: Path) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_stream.cli.main",
            "status",
            str(run_dir),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,  # a CLI's start-up alone took over 30 s at load 25
        check=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def pid_of(run_dir: Path, instance: str, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for svc in status(run_dir)["services"]:
            if svc["instance"] == instance:
                return int(svc["pid"])
        time.sleep(0.3)
    raise AssertionError(f"{instance} is not registered at the hub")


def killed_after_step_two(run: Run, instance: str) -> list[dict[str, Any]]:
    """Kill `instance` with SIGKILL once the run passed step 2; the run must still complete.
    The hub's `peer.joined` events of `instance` (a restarted service joins again)."""
    run.wait_steps(2)
    os.kill(pid_of(run.run_dir, instance), signal.SIGKILL)
    assert run.finish() == 0, run.output()[-3000:]
    return [e for e in hub_events(run.run_dir, "peer.joined") if e["instance"] == instance]


def service_events(run_dir: Path, service: str, event: str) -> list[dict[str, Any]]:
    """The `event` lines of every instance of `service` in the run's logs."""
    out = []
    for path in (run_dir / "logs").glob(f"{service}-*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("event") == event:
                out.append(row)
    return out


def hub_events(run_dir: Path, event: str) -> list[dict[str, Any]]:
    return service_events(run_dir, "grouper", event)


def finished_up(run_dir: Path, steps: int, *extra: str, timeout: float) -> Path:
    """`run_dir` after `up` ran `steps` steps with SMALL settings and `extra`, and succeeded."""
    cmd = up_command(run_dir, steps, *extra, settings=SMALL)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def changed_parameters(checkpoint: Path, model: str) -> list[str]:
    """The names of the parameters that differ between `checkpoint` and the shipped `model`."""
    from transformers import AutoModelForCausalLM

    from grpo_stream.models.loading import resolve_model

    trained = AutoModelForCausalLM.from_pretrained(checkpoint)
    initial = AutoModelForCausalLM.from_pretrained(resolve_model(model))
    before = dict(initial.named_parameters())
    return [n for n, p in trained.named_parameters() if not torch.equal(p, before[n])]


def weights_address(run_dir: Path) -> str:
    """The trainer's weight server address, from its `trainer.ready` event."""
    for path in (run_dir / "logs").glob("trainer-*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("event") == "trainer.ready":
                return str(row["weights"])
    raise AssertionError("no trainer.ready event")


def trainer_consumed(run_dir: Path) -> dict[int, list[int]]:
    """The trainer's own record: the groups of each step it applied (`batch.trained`); a
    step trained again after a trainer restart replaces the discarded one."""
    steps: dict[int, list[int]] = {}
    for path in sorted((run_dir / "logs").glob("trainer-*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("event") == "batch.trained":
                steps[int(row["step"])] = [int(g) for g in row["groups"]]
    return steps


def assert_exactly_once(run_dir: Path, steps: int) -> None:
    """No group in two of the trainer's surviving steps, and the hub counted trained exactly
    the groups the trainer consumed."""
    consumed = trainer_consumed(run_dir)
    assert sorted(consumed) == list(range(steps)), sorted(consumed)
    groups = [g for ids in consumed.values() for g in ids]
    assert len(groups) == len(set(groups)), "the trainer trained a group twice"
    counters = json.loads((run_dir / "hub" / "counters.json").read_text())
    assert counters["trained"] == len(groups), (counters, len(groups))


def assert_accounting(run_dir: Path, steps: int, groups_per_step: int = 4) -> dict[str, int]:
    counters: dict[str, int] = json.loads((run_dir / "hub" / "counters.json").read_text())
    done = sum(counters[k] for k in ("trained", "filtered", "stale", "failed", "discarded"))
    assert counters["dispatched"] == done + counters["in_progress"], counters
    # each served step once, by its sequence number: a step journaled just before a kill was
    # never logged as sent; the restarted hub logs it as resent when the trainer asks again
    served = {e["seq"]: e["groups"] for e in hub_events(run_dir, "batch.resent")}
    served |= {e["seq"]: e["groups"] for e in hub_events(run_dir, "batch.sent")}
    sent = [g for groups in served.values() for g in groups]
    assert len(sent) == len(set(sent)), "a group reached the trainer twice"
    # a step may be served short by dynamic sampling's holes (zero-signal groups not
    # refilled: grpo_stream.hub.refill), which the hub logs with each step
    short = sum(e.get("short", 0) for e in hub_events(run_dir, "batch.sent"))
    assert len(sent) + short >= steps * groups_per_step, (len(sent), short)
    return counters


@pytest.fixture
def background_run(tmp_path: Path) -> Iterator[list[Run]]:
    runs: list[Run] = []
    yield runs
    for run in runs:
        run.kill()
