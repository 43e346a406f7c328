"""The worker side of every sandbox: a process that loads user code once and answers the
parent's messages over a pipe of msgpack messages.

Runs in a process forked from multiprocessing's fork server (`pool.WorkerPool`). It ignores
SIGINT (the pool decides when workers stop), dies with the fork server, and caps its own
address space after loading, so runaway user code fails its call or kills only this worker.
Nothing it receives or sends is pickled: messages are msgpack.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
from collections.abc import Callable
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any

import msgpack

MAX_CAUSE_CHARS = 200
"""Longest error line a worker sends (`short`)."""

Handler = Callable[[list[Any]], None]
"""What loading returns: it handles every message but `["stop"]`, sending its own replies."""


def serve(
    conn: Connection,
    sys_path: list[str],
    memory_limit_mb: int,
    load: Callable[..., Handler],
    *args: Any,
) -> None:
    """A worker's life: ignore SIGINT, die with the parent, take the parent's sys.path,
    `load(conn, *args)` the user code (a failure is one `["load_error", cause]` and the worker
    exits), cap the address space at its size now plus `memory_limit_mb`, announce
    `["ready"]`, then hand every message but `["stop"]` to the handler `load` returned until
    the pipe closes or the parent says stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    _die_with_parent()
    sys.path[:] = sys_path
    try:
        handle = load(conn, *args)
    except Exception as exc:
        conn.send_bytes(pack(["load_error", short(f"{type(exc).__name__}: {exc}")]))
        return
    _limit_address_space(memory_limit_mb)
    conn.send_bytes(pack(["ready"]))
    while True:
        try:
            message = unpack(conn.recv_bytes())
        except EOFError:
            return
        if message[0] == "stop":
            return
        handle(message)


def short(text: str) -> str:
    """`text` on one line, at most MAX_CAUSE_CHARS characters: an error line for the parent."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_CAUSE_CHARS else text[: MAX_CAUSE_CHARS - 3] + "..."


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _die_with_parent() -> None:
    """SIGKILL this worker when the fork server dies, and let it die with the pool's owner.

    multiprocessing hands each forked child the fork server's "alive" fd; the fork server exits
    when every copy is closed. A worker that kept its copy would keep the fork server, and so
    itself, alive after the owner died: close it (a daemonic worker never forks anyway).
    """
    server: Any = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    if sys.platform != "linux":
        return

    parent, pr_set_pdeathsig = os.getppid(), 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _limit_address_space(memory_limit_mb: int) -> None:
    """Cap the address space at its current size plus `memory_limit_mb`."""
    baseline = 0
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="ascii") as status:
        sizes = [line.split()[1] for line in status if line.startswith("VmSize:")]
        baseline = int(sizes[0]) * 1024 if sizes else 0
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = baseline + memory_limit_mb * 2**20
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
