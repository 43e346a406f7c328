"""Reward functions for the sandbox tests: each misbehaves on the completion "boom".

On any other completion each returns float(len(completion)), so a test can tell the failed
completion from the ones that must keep their rewards. Workers import this module as
`bad_rewards` (the tests put this directory on sys.path before starting the pool).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

TRIGGER = "boom"


def length(completion: str, prompt: str = "", reference: dict[str, Any] | None = None) -> float:
    """A well-behaved reward: the completion's length."""
    return float(len(completion))


def scaled_length(
    completion: str,
    prompt: str = "",
    reference: dict[str, Any] | None = None,
    scale: float = 1.0,
) -> float:
    """A well-behaved reward with a parameter."""
    return scale * len(completion)


def worker_pid(completion: str, prompt: str = "", reference: dict[str, Any] | None = None) -> float:
    """The pid of the worker process that ran the call."""
    return float(os.getpid())


def raises(completion: str, **_: Any) -> float:
    if completion == TRIGGER:
        raise ValueError("no answer tag")
    return float(len(completion))


def raises_system_exit(completion: str, **_: Any) -> float:
    if completion == TRIGGER:
        sys.exit(2)
    return float(len(completion))


def sleeps_forever(completion: str, **_: Any) -> float:
    while completion == TRIGGER:
        time.sleep(3600)
    return float(len(completion))


def spins_forever(completion: str, **_: Any) -> float:
    if completion == TRIGGER:
        while True:
            pass
    return float(len(completion))


def exits(completion: str, **_: Any) -> float:
    if completion == TRIGGER:
        os._exit(3)
    return float(len(completion))


def memory_bomb(completion: str, **_: Any) -> float:
    hoard = []
    while completion == TRIGGER:
        hoard.append(bytearray(16 * 2**20))
    return float(len(completion))


def returns_nan(completion: str, **_: Any) -> float:
    return float("nan") if completion == TRIGGER else float(len(completion))


def returns_inf(completion: str, **_: Any) -> float:
    return float("-inf") if completion == TRIGGER else float(len(completion))


def returns_string(completion: str, **_: Any) -> Any:
    return "1.0" if completion == TRIGGER else float(len(completion))


CALLS = 0


def counts_calls(completion: str, **_: Any) -> float:
    """How many calls this worker process has run, this one included."""
    global CALLS
    CALLS += 1
    return float(CALLS)


def reads_product(completion: str, *, reference: dict[str, Any], **_: Any) -> float:
    """A reward written for another task: it reads a reference key the task lacks."""
    return float(completion == reference["product"])


def burns_cpu(completion: str, **_: Any) -> float:
    """Spins on the CPU for 50 ms of this process's CPU time."""
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    return float(len(completion))
