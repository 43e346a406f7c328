"""The worker side of the reward sandbox: a process that loads reward functions once and
runs chunks of calls, replying with their results over a pipe of msgpack messages.

A chunk is `["score", prompt, reference, [[component, text], ...]]`; the worker runs its
calls in order and sends `["results", first, items, cpu_s]` (items: `[value, kind, cause,
key, trace]` of calls first, first + 1, ...) whenever `FLUSH_S` has passed since its last
reply, `FLUSH_ITEMS` are waiting, or the chunk ends; it stops the chunk after a MemoryError.
So a call slower than FLUSH_S is reported as it ends (the parent's deadline for the call
that runs is the last reply plus FLUSH_S plus `timeout_s`), and a fast reward's calls cost
one message per chunk. `cpu_s` is the worker's CPU time since it loaded its rewards. A
traceback travels with the first failure of each distinct (component, key) only.

Runs in a process forked from multiprocessing's fork server (see `sandbox.py`). It ignores
SIGINT (the pool decides when workers stop), dies with the fork server, and caps its own
address space after loading, so a runaway reward fails its call or kills only this worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import numbers
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any, Protocol, runtime_checkable

import msgpack

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards import load_reward
from grpo_stream.rewards.failures import MAX_CAUSE_CHARS, describe, short
from grpo_stream.rewards.judge import Unparsed

FLUSH_S = 0.05
"""A worker replies at least this often while it has results (and a call is not running)."""
FLUSH_ITEMS = 32
"""... and when this many results wait (a reply stays small)."""

RewardFn = Callable[..., float]
Item = list[Any]
"""One call's result as it travels: [value, kind, cause, key, trace] (see the module doc)."""


@runtime_checkable
class BatchReward(Protocol):
    """A reward that scores a chunk at once (a reward model): one value per completion."""

    def score_batch(
        self, completions: list[str], *, prompt: str, reference: dict[str, Any]
    ) -> list[float]: ...


def _load_rewards(specs: list[dict[str, Any]]) -> list[RewardFn]:
    return [load_reward(RewardSpec.model_validate(spec)) for spec in specs]


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


def _short(text: str) -> str:
    return short(text, MAX_CAUSE_CHARS)


def _call_one(fn: RewardFn, completion: str, prompt: str, reference: bytes) -> Item:
    """Run one reward call: its result item (see the module doc)."""
    try:
        value = fn(completion, prompt=prompt, reference=unpack(reference))
        if not isinstance(value, numbers.Real):
            return [None, "not_a_number", f"returned {type(value).__name__}, not a number", "", ""]
        number = float(value)
    except MemoryError:
        return [None, "memory", "memory limit", "", ""]
    except BaseException as exc:  # a reward may raise anything, SystemExit included
        raised = describe(exc)
        return [None, "raised", raised.cause, raised.key, raised.trace]
    if not math.isfinite(number):
        return [None, "non_finite", f"returned non-finite value {number}", "", ""]
    return [number, None, None, "", ""]


def _call_batch(
    fn: BatchReward, completions: list[str], prompt: str, reference: bytes
) -> list[Item]:
    """Score a chunk in one call: one item per completion; a failure of the call fails every
    completion of the chunk."""
    try:
        values = list(fn.score_batch(completions, prompt=prompt, reference=unpack(reference)))
        if len(values) != len(completions):
            cause = f"score_batch returned {len(values)} values for {len(completions)}"
            return [[None, "raised", cause, "", ""] for _ in completions]
    except MemoryError:
        return [[None, "memory", "memory limit", "", ""] for _ in completions]
    except BaseException as exc:  # a reward may raise anything, SystemExit included
        raised = describe(exc)
        return [[None, "raised", raised.cause, raised.key, raised.trace] for _ in completions]
    out: list[Item] = []
    for value in values:
        if isinstance(value, Unparsed):  # a judge wrote no score: NaN, counted apart
            cause = _short(f"no score in the judge's {value.text!r}")
            out.append([None, "unparseable", cause, "", ""])
        elif not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            out.append([None, "non_finite", f"returned {value!r}", "", ""])
        else:
            out.append([float(value), None, None, "", ""])
    return out


def serve(
    conn: Connection,
    sys_path: list[str],
    memory_limit_mb: int,
    load: Callable[[], Callable[[list[Any]], None]],
) -> None:
    """The worker core shared by the reward and environment sandboxes: ignore SIGINT, die
    with the parent, take the parent's sys.path, `load()` the user code (a failure is one
    `["load_error", cause]` and the worker exits), cap the address space, announce
    `["ready"]`, then hand every message but `["stop"]` to the handler `load()` returned
    (it sends its own replies on `conn`) until the pipe closes or the parent says stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    _die_with_parent()
    sys.path[:] = sys_path
    try:
        handle = load()
    except Exception as exc:
        conn.send_bytes(pack(["load_error", _short(f"{type(exc).__name__}: {exc}")]))
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


def worker_main(
    conn: Connection, specs: list[dict[str, Any]], sys_path: list[str], memory_limit_mb: int
) -> None:
    """Entry point of a reward worker: load the rewards, then run chunks (`serve`)."""

    def load() -> Callable[[list[Any]], None]:
        return _Chunks(conn, _load_rewards(specs)).run

    serve(conn, sys_path, memory_limit_mb, load)


class _Chunks:
    """Runs chunks of calls and replies (see the module doc); remembers the distinct
    failures whose traceback it has sent."""

    def __init__(self, conn: Connection, fns: list[RewardFn]) -> None:
        self.conn = conn
        self.fns = fns
        self.cpu_at_load = time.process_time()
        self.traced: set[tuple[int, str]] = set()

    def run(self, message: list[Any]) -> None:
        _, prompt, reference, calls = message
        pending: list[Item] = []
        first, i, last_reply = 0, 0, time.monotonic()
        while i < len(calls):
            component, end = calls[i][0], i + 1
            fn = self.fns[component]
            if isinstance(fn, BatchReward):  # the run of its calls in one score_batch
                while end < len(calls) and calls[end][0] == component:
                    end += 1
                items = _call_batch(fn, [text for _, text in calls[i:end]], prompt, reference)
            else:
                items = [_call_one(fn, calls[i][1], prompt, reference)]
            pending += [self._traced_once(component, item) for item in items]
            i = end
            stop = any(item[1] == "memory" for item in items)  # its state is in doubt
            due = time.monotonic() - last_reply >= FLUSH_S or len(pending) >= FLUSH_ITEMS
            if stop or due or i == len(calls):
                cpu_s = time.process_time() - self.cpu_at_load
                self.conn.send_bytes(pack(["results", first, pending, cpu_s]))
                first, pending, last_reply = first + len(pending), [], time.monotonic()
            if stop:
                return

    def _traced_once(self, component: int, item: Item) -> Item:
        """The item, without its traceback when this failure went with one before."""
        key = (component, str(item[3]))
        if item[4] and key in self.traced:
            return [*item[:4], ""]
        self.traced.add(key)
        return item


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)
