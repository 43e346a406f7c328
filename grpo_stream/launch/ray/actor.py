"""The Ray side of `up --launcher ray`: one actor per service, running the same
`grpo-stream run SERVICE` as a child process on the actor's node.

The actor (`ServiceProcess`, made a Ray actor by grpo_stream.launch.ray.runner) writes what
the service needs from `up`'s machine (its secret, keys and the hub's config,
grpo_stream.launch.shipping) into RUN_DIR/private/INSTANCE on its node, starts the service in
a session of its own, and streams its output lines back (`lines`, a Ray streaming generator).

Invariants:
- the service dies with its actor: it gets SIGTERM when the actor's process ends, even by
  SIGKILL (PDEATHSIG, set from the thread that outlives it: the actor's constructor runs on
  the worker's main thread), so a dead driver, `ray stop` or a killed actor leave nothing;
- a service that exits non-zero (not asked to stop) ends its actor's process, so Ray's
  restart policy (`max_restarts`) starts both again; a restarted trainer or hub resumes from
  its checkpoint (--resume); exit 0 ends the stream, and `up` decides what follows;
- `stop` may run while `lines` streams (a threaded actor).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from grpo_stream.launch.shipping import unpack
from grpo_stream.launch.supervisor import QUIET_ENV, die_with_launcher, signal_group

PYTHON = "{python}"
"""Stands for the node's own interpreter in a command line `up` built on another machine."""
RESUMING = ("trainer", "grouper")
DROPPED_ENV = ("OMP_NUM_THREADS",)
"""Set by Ray for actors (1 with num_cpus=0); a service sizes its own threads."""
EXIT_FLUSH_S = 0.2  # lets the last streamed item reach the driver before the process ends


class ServiceProcess:
    """One service on this node, started when the actor is (and again when Ray restarts it)."""

    def __init__(
        self,
        service: str,
        argv: list[str],
        env: dict[str, str],
        private_dir: str,
        files: dict[str, bytes],
        restarted: bool,
    ) -> None:
        if files:
            unpack(files, Path(private_dir))
        argv = [sys.executable if a == PYTHON else a for a in argv]
        if restarted and service in RESUMING and "--resume" not in argv:
            argv.append("--resume")
        environ = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        environ.update({**QUIET_ENV, **env, "PYTHONUNBUFFERED": "1"})
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=environ,
            start_new_session=True,
            preexec_fn=die_with_launcher,
        )
        self.restarted = restarted
        self._pending: list[str] = []
        self._ended = False  # the service's output closed
        self._stopping = False
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        stdout = self.popen.stdout
        if stdout is None:  # never: stdout is a pipe
            raise RuntimeError("no stdout pipe")
        for raw in stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line:
                with self._cv:
                    self._pending.append(line)
                    self._cv.notify_all()
        with self._cv:
            self._ended = True
            self._cv.notify_all()

    def info(self) -> dict[str, object]:
        """Where the service runs: its pid, this node's host name, whether Ray restarted it."""
        return {"pid": self.popen.pid, "host": socket.gethostname(), "restarted": self.restarted}

    def lines(self) -> Iterator[list[str] | int]:
        """The service's output lines, in batches as they come; then its exit code. A
        non-zero exit nobody asked for ends this actor's process (Ray restarts it)."""
        while True:
            with self._cv:
                self._cv.wait_for(lambda: bool(self._pending) or self._ended, timeout=1.0)
                batch, self._pending = self._pending, []
                ended = self._ended and not self._pending
            if batch:
                yield batch
            if ended:
                break
        code = self.popen.wait()
        yield code
        if code != 0 and not self._stopping:
            time.sleep(EXIT_FLUSH_S)
            os._exit(1)

    def stop(self, grace_s: float) -> int:
        """SIGTERM to the service's process group, SIGKILL after `grace_s`; its exit code."""
        self._stopping = True
        signal_group(self.popen, signal.SIGTERM)
        try:
            return self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            signal_group(self.popen, signal.SIGKILL)
            return self.popen.wait()


def free_port(address: str) -> int:
    """A TCP port free on `address` now (run on the node that will bind it)."""
    with socket.socket() as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port
