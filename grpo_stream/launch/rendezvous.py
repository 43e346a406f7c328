"""Wait until a trainer node can reach the rendezvous, then become torchrun.

    python -m grpo_stream.launch.rendezvous --address HOST:PORT --host-name NODE \\
        --timeout 120 -- python -m torch.distributed.run ...

Nodes after the first run this in front of torchrun: the first trainer host opens the
rendezvous store when its torchrun starts, and a node that cannot reach it within
`trainer.rendezvous_timeout_s` exits 2 with one line naming the host and port, instead of
torchrun's retries and tracebacks. The probe only connects and closes.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time


def reachable(host: str, port: int, timeout_s: float, interval_s: float = 0.5) -> bool:
    """Whether a TCP connection to host:port succeeds within timeout_s (retrying)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(2.0, left))):
                return True
        except OSError:
            if time.monotonic() + interval_s > deadline:
                return False
            time.sleep(interval_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="grpo_stream.launch.rendezvous")
    parser.add_argument("--address", required=True, help="HOST:PORT of the rendezvous")
    parser.add_argument("--host-name", default="", help="this node's name, for the message")
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    host, _, port = args.address.rpartition(":")
    if not command:
        parser.error("give the command to run after --")
    if not reachable(host, int(port), args.timeout):
        print(
            f"trainer rendezvous {host}:{port} (the first trainer host) unreachable from "
            f"{args.host_name or socket.gethostname()} after {args.timeout:g}s "
            "(trainer.rendezvous_timeout_s, trainer.rendezvous_port)",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
