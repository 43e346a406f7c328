"""Shared by the cluster tests: the run directory a node keeps, and a stranger at the hub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import zmq

from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import decode, encode


def events(run_dir: Path, service: str, event: str) -> list[dict[str, Any]]:
    """`event` rows of `service`'s logs in RUN_DIR/logs (one node's own)."""
    out = []
    for path in sorted((run_dir / "logs").glob(f"{service}-*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("event") == event:
                out.append(row)
    return out


def rewards(run_dir: Path) -> list[float]:
    path = run_dir / "metrics.jsonl"
    return [float(json.loads(line)["reward_mean"]) for line in path.read_text().splitlines()]


def stranger_hello(address: str, service: str = "scorer", timeout_ms: int = 5000) -> m.Message:
    """A Hello without the run's secret, as a process that only reached the port would send
    it; the hub's reply (Error, or Welcome when it let the stranger in)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    hello = m.Hello(service=service, instance=f"{service}-stranger", host="stranger", pid=1,
                    capacity=4)  # fmt: skip
    try:
        sock.send_multipart([bytes(f) for f in encode(hello)])
        if not sock.poll(timeout_ms):
            raise AssertionError(f"the hub at {address} did not answer a stranger's Hello")
        return decode(sock.recv_multipart())
    finally:
        sock.close()
        ctx.term()
