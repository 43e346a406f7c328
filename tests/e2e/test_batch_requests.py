"""A trainer that asks twice for the same step before the hub can answer gets one batch,
and the hub counts those groups once. (A trainer does not repeat itself when it says Hello
again with its weight server: tests/unit/test_runtime.py.) Real hub, generator and scorer
processes; the test speaks the trainer's side of the wire."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_stream.config.transport import SecuritySettings, TransportSettings
from grpo_stream.protocols import messages as m
from grpo_stream.transport.sockets import Client, close_context, handshake, make_context

GROUPS = 4


def _service(run_dir: Path, service: str, *args: str) -> subprocess.Popen[bytes]:
    log = (run_dir.parent / f"{service}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_stream.cli.main", "run", service, *args],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[str]:
    run_dir = tmp_path / "run"
    settings = {
        "run.run_dir": str(run_dir),
        "hub.groups_per_step": GROUPS,
        "generator.group_size": 4,
        "generator.prompts_per_request": 4,
        "transport.heartbeat_timeout_s": 600.0,  # the test's trainer does not beat
    }
    sets = [arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")]
    procs = [_service(tmp_path, "grouper", *sets)]
    try:
        addr_file = run_dir / "hub.addr"
        deadline = time.monotonic() + 60
        while not addr_file.exists() and time.monotonic() < deadline:
            assert procs[0].poll() is None, (tmp_path / "grouper.log").read_text()
            time.sleep(0.1)
        address = addr_file.read_text().strip()
        procs += [_service(tmp_path, s, "--hub", address) for s in ("generator", "scorer")]
        yield address
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_repeated_request_for_a_step_gets_one_batch(hub: str) -> None:
    ctx = make_context()
    client = Client(ctx, hub, TransportSettings(), SecuritySettings(), "trainer-0")
    try:
        hello = m.Hello(service="trainer", instance="trainer-0", host="test", pid=1, capacity=1)
        handshake(client, hello, timeout_s=30)
        request = m.BatchRequest(step=0, trainer_version=0)
        client.send(request)
        client.send(request)  # as a trainer does after saying Hello again
        batches = []
        deadline = time.monotonic() + 180
        while not batches and time.monotonic() < deadline:
            got = client.recv(200)
            if isinstance(got, m.TrainBatch):
                batches.append(got)
        assert batches, "no batch in 180 s"
        quiet_until = time.monotonic() + 5  # generation goes on: a second batch would come now
        while time.monotonic() < quiet_until:
            got = client.recv(200)
            if isinstance(got, m.TrainBatch):
                batches.append(got)
        assert len(batches) == 1
        assert len(batches[0].group_ids) == GROUPS
        client.send(m.StatusRequest())
        status = None
        while status is None:
            got = client.recv(5000)
            assert got is not None, "no Status from the hub"
            status = got if isinstance(got, m.Status) else None
        counters = dict(status.counters)
        assert counters["trained"] == GROUPS, json.dumps(counters)
    finally:
        client.close()
        close_context(ctx)
