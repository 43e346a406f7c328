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

Runs in a sandbox worker (`grpo_stream.sandbox.worker.serve`: forked from the fork server,
SIGINT ignored, dead with its parent, address space capped after loading), so a runaway
reward fails its call or kills only this worker.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Protocol, runtime_checkable

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards import load_reward
from grpo_stream.rewards.failures import describe
from grpo_stream.rewards.judge import Unparsed
from grpo_stream.sandbox.worker import Handler, pack, short, unpack

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
            cause = short(f"no score in the judge's {value.text!r}")
            out.append([None, "unparseable", cause, "", ""])
        elif not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            out.append([None, "non_finite", f"returned {value!r}", "", ""])
        else:
            out.append([float(value), None, None, "", ""])
    return out


def load(conn: Connection, specs: list[dict[str, Any]]) -> Handler:
    """A reward worker's code (`grpo_stream.sandbox.worker.serve` calls it): the rewards of
    `specs`, and the handler that runs chunks of calls with them."""
    return _Chunks(conn, _load_rewards(specs)).run


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
