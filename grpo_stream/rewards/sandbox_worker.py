"""The worker side of the reward sandbox: a process that loads reward functions once and
answers calls, one reply per completion, over a pipe of msgpack messages.

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
from collections.abc import Callable
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any, Protocol, runtime_checkable

import msgpack

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards import load_reward
from grpo_stream.rewards.judge import Unparsed

MAX_CAUSE_CHARS = 200

RewardFn = Callable[..., float]


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
    text = " ".join(text.split())
    return text if len(text) <= MAX_CAUSE_CHARS else text[: MAX_CAUSE_CHARS - 3] + "..."


def _call_one(
    fn: RewardFn, completion: str, prompt: str, reference: bytes
) -> tuple[float | None, str | None, str | None]:
    """Run one reward call: (value, None, None) or (None, failure kind, cause)."""
    try:
        value = fn(completion, prompt=prompt, reference=unpack(reference))
        if not isinstance(value, numbers.Real):
            return None, "not_a_number", f"returned {type(value).__name__}, not a number"
        number = float(value)
    except MemoryError:
        return None, "memory", "memory limit"
    except BaseException as exc:  # a reward may raise anything, SystemExit included
        return None, "raised", _short(f"raised {type(exc).__name__}: {exc}")
    if not math.isfinite(number):
        return None, "non_finite", f"returned non-finite value {number}"
    return number, None, None


def _call_batch(
    fn: BatchReward, completions: list[str], prompt: str, reference: bytes
) -> list[tuple[float | None, str | None, str | None]]:
    """Score a chunk in one call: one (value, kind, cause) per completion; a failure of the
    call fails every completion of the chunk."""
    try:
        values = list(fn.score_batch(completions, prompt=prompt, reference=unpack(reference)))
        if len(values) != len(completions):
            cause = f"score_batch returned {len(values)} values for {len(completions)}"
            return [(None, "raised", cause)] * len(completions)
    except MemoryError:
        return [(None, "memory", "memory limit")] * len(completions)
    except BaseException as exc:  # a reward may raise anything, SystemExit included
        return [(None, "raised", _short(f"raised {type(exc).__name__}: {exc}"))] * len(completions)
    out: list[tuple[float | None, str | None, str | None]] = []
    for value in values:
        if isinstance(value, Unparsed):  # a judge wrote no score: NaN, counted apart
            out.append((None, "unparseable", _short(f"no score in the judge's {value.text!r}")))
        elif not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            out.append((None, "non_finite", f"returned {value!r}"))
        else:
            out.append((float(value), None, None))
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
    """Entry point of a reward worker: load the rewards, then score chunks (`serve`)."""

    def load() -> Callable[[list[Any]], None]:
        fns = _load_rewards(specs)

        def handle(message: list[Any]) -> None:
            _, component, prompt, completions, reference = message
            fn = fns[component]
            if isinstance(fn, BatchReward):
                results = iter(_call_batch(fn, completions, prompt, reference))
            else:  # one reply as each call ends: the parent's deadline is per completion
                results = (_call_one(fn, c, prompt, reference) for c in completions)
            for position, (value, kind, cause) in enumerate(results):
                conn.send_bytes(pack(["result", position, value, kind, cause]))

        return handle

    serve(conn, sys_path, memory_limit_mb, load)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)
