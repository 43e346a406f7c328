"""A service's torch threads as `up` planned them: the plan's record, how it travels in the
environment, and how a starting service applies it (`grpo_stream.launch.threads` plans).

`ThreadPlan.env` carries a plan to a service: OMP_NUM_THREADS and MKL_NUM_THREADS (read by the
OpenMP and MKL runtimes when they start), and GRPO_STREAM_TORCH_THREADS /
GRPO_STREAM_INTEROP_THREADS / GRPO_STREAM_CPUS, which the service applies at start-up
(`pin_from_env`, then `set_torch_threads(plan_from_env(...))`) before torch runs its first op.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

ENV_THREADS = "GRPO_STREAM_TORCH_THREADS"
ENV_INTEROP = "GRPO_STREAM_INTEROP_THREADS"
ENV_CPUS = "GRPO_STREAM_CPUS"

TorchThreads = int | Literal["auto"]


@dataclass(frozen=True)
class ThreadPlan:
    """One service's threads: torch intra-op, inter-op, and the CPUs it is pinned to."""

    threads: int
    interop: int = 1
    cpus: tuple[int, ...] = ()
    """CPU ids of the service's affinity; empty: not pinned."""

    def env(self) -> dict[str, str]:
        """The environment that carries this plan to the service."""
        n = str(self.threads)
        env = {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, ENV_THREADS: n}
        env[ENV_INTEROP] = str(self.interop)
        if self.cpus:
            env[ENV_CPUS] = ",".join(str(c) for c in self.cpus)
        return env


def fixed_plan(threads: int) -> ThreadPlan:
    """`run.torch_threads = N`: N threads, unpinned."""
    return ThreadPlan(threads=threads)


def local_cores() -> list[int]:
    """The CPU ids this process may run on (its affinity: taskset, cgroup cpusets)."""
    return sorted(os.sched_getaffinity(0))


def plan_from_env(setting: TorchThreads, environ: Mapping[str, str]) -> ThreadPlan:
    """The plan a starting service applies: what `up` put in its environment, else the
    setting (auto: every core this process may use)."""
    if ENV_THREADS in environ:
        cpus = environ.get(ENV_CPUS, "")
        return ThreadPlan(
            threads=int(environ[ENV_THREADS]),
            interop=int(environ.get(ENV_INTEROP, "1")),
            cpus=tuple(int(c) for c in cpus.split(",") if c),
        )
    if setting == "auto":
        return ThreadPlan(threads=len(local_cores()))
    return fixed_plan(setting)


def pin_from_env(environ: Mapping[str, str]) -> None:
    """Pin this process to the CPUs `up` gave it, if any (before torch starts its thread
    pools: their threads inherit the affinity of the thread that creates them)."""
    cpus = [int(c) for c in environ.get(ENV_CPUS, "").split(",") if c]
    if cpus:
        os.sched_setaffinity(0, cpus)


def set_torch_threads(plan: ThreadPlan) -> None:
    """torch's intra-op and inter-op pool sizes (inter-op only before its first use)."""
    import torch

    torch.set_num_threads(plan.threads)
    if torch.get_num_interop_threads() != plan.interop:
        # the inter-op pool may already have run a task: then it keeps its size
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(plan.interop)


def current() -> dict[str, int | list[int]]:
    """This process's torch threads and CPU affinity as they are (for the start-up log)."""
    import torch

    return {
        "threads": torch.get_num_threads(),
        "interop": torch.get_num_interop_threads(),
        "cpus": sorted(os.sched_getaffinity(0)),
    }
