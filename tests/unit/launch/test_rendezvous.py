"""The rendezvous wait in front of torchrun on a trainer node after the first."""

from __future__ import annotations

import socket
import subprocess
import sys

from grpo_stream.launch.rendezvous import reachable


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once this socket closes


def _wait(port: int, *flags: str) -> list[str]:
    """The rendezvous wait for 127.0.0.1:port in front of a command that prints `ran`."""
    module = [sys.executable, "-m", "grpo_stream.launch.rendezvous"]
    command = [sys.executable, "-c", "print('ran')"]
    return [*module, f"--address=127.0.0.1:{port}", *flags, "--", *command]


def test_unreachable_rendezvous_is_one_line_naming_host_and_port() -> None:
    port = _closed_port()
    cmd = _wait(port, "--host-name=node-b", "--timeout=1")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""  # the command never ran
    assert result.stderr.strip() == (
        f"trainer rendezvous 127.0.0.1:{port} (the first trainer host) unreachable from node-b "
        "after 1s (trainer.rendezvous_timeout_s, trainer.rendezvous_port)"
    )


def test_reachable_rendezvous_runs_the_command() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        cmd = _wait(port, "--timeout=5")
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "ran\n")


def test_reachable_is_false_for_a_closed_port_within_the_timeout() -> None:
    assert not reachable("127.0.0.1", _closed_port(), timeout_s=0.3)
