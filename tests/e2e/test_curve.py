"""A run with security.curve on: keys from `grpo-stream keys init`, every service over CURVE.

While it is live, a client with an allow-listed key is answered by the hub and by the
trainer's weight server; a client with a key that is not on the allow-list, and a plaintext
client, get no answer from either.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth

from grpo_stream.protocols import messages as m
from grpo_stream.protocols.codec import decode, encode

from .conftest import Run, assert_accounting, weights_address

pytestmark = pytest.mark.slow
STEPS = 150  # long enough to stay up while the clients below are refused (3 s each)
REFUSED_WAIT_MS = 3000
CLIENTS = ("allowed", "unknown_key", "plaintext")


def keys_init(directory: Path) -> None:
    subprocess.run([sys.executable, "-m", "grpo_stream.cli.main", "keys", "init", str(directory)],
                   check=True, capture_output=True, timeout=60)  # fmt: skip


def ask(address: str, keys: tuple[bytes, bytes, bytes] | None) -> m.Message | None:
    """Send StatusRequest from a fresh DEALER; the first reply, or None within the wait."""
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = keys
    try:
        sock.connect(address)
        sock.send_multipart([bytes(f) for f in encode(m.StatusRequest())])
        return decode(sock.recv_multipart()) if sock.poll(REFUSED_WAIT_MS) else None
    finally:
        sock.close()
        ctx.term()


def client_keys(keys_dir: Path) -> dict[str, tuple[bytes, bytes, bytes] | None]:
    server, _ = zmq.auth.load_certificate(str(keys_dir / "server.key"))
    public, secret = zmq.auth.load_certificate(str(keys_dir / "client.key_secret"))
    assert secret is not None
    stranger_public, stranger_secret = zmq.curve_keypair()
    return {
        "allowed": (public, secret, server),
        "unknown_key": (stranger_public, stranger_secret, server),
        "plaintext": None,
    }


@dataclass
class CurveRun:
    run_dir: Path
    exit_code: int
    output: str
    replies: dict[tuple[str, str], m.Message | None]  # (socket, client) -> reply


@pytest.fixture(scope="module")
def curve_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CurveRun]:
    base = tmp_path_factory.mktemp("curve")
    keys_init(base / "keys")
    run = Run(base / "run", STEPS, "--set", "security.curve=true",
              "--set", f"security.keys_dir={base / 'keys'}")  # fmt: skip
    try:
        run.wait_steps(1)
        # the weight server first: the run must still be up when the refused clients time out
        addresses = {"weights": weights_address(run.run_dir),
                     "hub": (run.run_dir / "hub.addr").read_text().strip()}  # fmt: skip
        keys = client_keys(base / "keys")
        replies = {(sock, who): ask(addr, keys[who])
                   for sock, addr in addresses.items() for who in CLIENTS}  # fmt: skip
        code = run.finish()
        yield CurveRun(run.run_dir, code, Path(run.log.name).read_text(), replies)
    finally:
        run.kill()


def test_curve_run_completes(curve_run: CurveRun) -> None:
    assert curve_run.exit_code == 0, curve_run.output[-3000:]
    assert_accounting(curve_run.run_dir, STEPS)


def test_allowed_client_is_answered_by_the_hub(curve_run: CurveRun) -> None:
    assert isinstance(curve_run.replies["hub", "allowed"], m.Status)


def test_allowed_client_is_answered_by_the_weight_server(curve_run: CurveRun) -> None:
    reply = curve_run.replies["weights", "allowed"]
    assert isinstance(reply, m.Error) and reply.code == "unexpected"  # it only serves weights


@pytest.mark.parametrize("socket", ["hub", "weights"])
def test_client_with_unknown_key_gets_no_answer(curve_run: CurveRun, socket: str) -> None:
    assert curve_run.replies[socket, "unknown_key"] is None


@pytest.mark.parametrize("socket", ["hub", "weights"])
def test_plaintext_client_gets_no_answer(curve_run: CurveRun, socket: str) -> None:
    assert curve_run.replies[socket, "plaintext"] is None
