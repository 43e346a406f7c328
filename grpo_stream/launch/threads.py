"""Torch threads of the services `up` starts on its machine: a number, or sized from the cores.

`run.torch_threads = N`: every torch service (trainer ranks, generators, evaluator) runs N
intra-op threads, as before. `run.torch_threads = "auto"`: `up` splits the cores it may use
(its CPU affinity) among the torch services it starts on its own machine, in proportion to
each one's busy share (the fraction of the run's wall time that service computes: measured
from the run directory's metrics.jsonl when the run resumes, else `BUSY_SHARES`), at least
one thread each; a service with a whole
number of cores to itself is pinned to them (`os.sched_setaffinity`), so the trainer's and
the generators' OpenMP pools never share a core. When every service gets one thread (as many
torch services as cores, or more) none is pinned: a single thread has no pool to keep apart,
and unpinned the kernel moves it to whichever core the other services (and the hub and
scorers) leave idle; pinned one core each, bench.vs_trl ran 0.78x as fast on 2 cores.

Hub and scorers run no torch ops: they are neither sized nor pinned, and take CPU where the
kernel finds it. With `scorer.workers = "auto"` each scorer on the machine gets an equal
share of the cores the torch services' threads leave, as reward workers (`size_scorers`;
grpo_stream.rewards.sizing). A service that `up` did not size (started by hand with
`grpo-stream run`, or on another host of a cluster) runs with `auto` as many threads as it
has cores.

The plan travels to each service as environment (`ThreadPlan.env`): OMP_NUM_THREADS and
MKL_NUM_THREADS (read by the OpenMP and MKL runtimes when they start), and
GRPO_STREAM_TORCH_THREADS / GRPO_STREAM_INTEROP_THREADS / GRPO_STREAM_CPUS, which the
service applies at start-up (`apply_threads`) before torch runs its first op.

Invariants: every torch service gets at least one thread; pinned CPU sets are disjoint and
lie inside the cores `up` may use; the threads of pinned services never exceed the cores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_stream.launch.supervisor import ServiceSpec
from grpo_stream.rewards.sizing import ENV_WORKERS, ScorerWorkers, spare_share
from grpo_stream.threads import ENV_THREADS, ThreadPlan, TorchThreads, fixed_plan, local_cores
from grpo_stream.training.metrics import read_metrics

TORCH_SERVICES = ("trainer", "generator", "evaluator", "teacher")
"""Services that run torch ops on the CPU (the hub and the scorers do not)."""
BUSY_SHARES: Mapping[str, float] = {
    "trainer": 1.0,
    "generator": 1.0,
    "evaluator": 0.25,
    "teacher": 0.5,
}
"""Busy share per service (fraction of the run's wall time it computes). The trainer and the
generators of an asynchronous run are both busy most of the time (the trainer waits ~0-10%
for a batch, see metrics.jsonl's trainer_wait_s; the generator ~0-15% for weights, its
heartbeat's wait_s); the evaluator runs once every `eval.every` steps; a teacher runs one
forward per group (no sampling), a fraction of a generator's work."""
MIN_SHARE = 0.05
"""The smallest busy share a measurement gives a service (a service never gets no core)."""
MEASURED_ROWS = 200
"""Steps of a resumed run's metrics that its busy shares are measured over (the latest)."""


def split_cores(
    cores: Sequence[int], services: Sequence[str], shares: Mapping[str, float]
) -> list[ThreadPlan]:
    """Threads (and pinned CPUs) for each torch service in `services` (service kinds, in
    start order) from the CPU ids `cores`: proportional to the services' busy `shares`,
    largest remainders first, at least one each. Pure: no look at the machine."""
    if not services:
        return []
    weights = [shares[s] for s in services]
    if len(services) > len(cores) or min(weights) <= 0:
        return [ThreadPlan(threads=1) for _ in services]
    exact = [len(cores) * w / sum(weights) for w in weights]
    counts = [max(1, int(x)) for x in exact]
    by_remainder = sorted(range(len(services)), key=lambda i: counts[i] - exact[i])
    for i in by_remainder:  # most under-served first, until every core is given
        if sum(counts) >= len(cores):
            break
        counts[i] += 1
    while sum(counts) > len(cores):  # the at-least-one floor over-gave: take from the largest
        counts[counts.index(max(counts))] -= 1
    if max(counts) == 1:  # one thread each: no OpenMP pool to keep apart, let the kernel
        return [ThreadPlan(threads=1) for _ in services]  # move each to an idle core
    plans, start = [], 0
    for n in counts:
        plans.append(ThreadPlan(threads=n, cpus=tuple(cores[start : start + n])))
        start += n
    return plans


def measured_shares(rows: Sequence[Mapping[str, Any]], generators: int) -> dict[str, float]:
    """Busy shares of trainer and generators from a run's metrics rows (metrics.jsonl): the
    trainer is busy but for its `trainer_wait_s`, the generators but for the growth of their
    summed `gen_wait_s`, over the wall time from the first row to the last; at least
    MIN_SHARE each. Empty when there are fewer than two rows (nothing measured)."""
    if len(rows) < 2 or generators < 1:
        return {}
    span = float(rows[-1]["wall_time"]) - float(rows[0]["wall_time"])
    if span <= 0:
        return {}
    trainer_wait = sum(float(r["trainer_wait_s"]) for r in rows[1:])
    gen_wait = float(rows[-1]["gen_wait_s"]) - float(rows[0]["gen_wait_s"])
    return {
        "trainer": max(MIN_SHARE, min(1.0, 1.0 - trainer_wait / span)),
        "generator": max(MIN_SHARE, min(1.0, 1.0 - gen_wait / (span * generators))),
    }


def run_shares(run_dir: Path, generators: int) -> dict[str, float]:
    """BUSY_SHARES, with the trainer's and generators' measured in the run directory's
    metrics when it has them (a resumed run: its last `MEASURED_ROWS` steps)."""
    rows = read_metrics(run_dir)[-MEASURED_ROWS:]
    return {**BUSY_SHARES, **measured_shares(rows, generators)}


def service_plans(
    setting: TorchThreads,
    services: Sequence[str],
    cores: Sequence[int] | None = None,
    shares: Mapping[str, float] = BUSY_SHARES,
) -> list[ThreadPlan | None]:
    """One plan per service of `services` (kinds, in start order): None for services without
    torch; a fixed plan for a number; for auto the split of `cores` (default: this
    machine's) by `shares`."""
    torch_kinds = [s for s in services if s in TORCH_SERVICES]
    if setting == "auto":
        sized = iter(split_cores(cores or local_cores(), torch_kinds, shares))
    else:
        sized = iter([fixed_plan(setting)] * len(torch_kinds))
    return [next(sized) if s in TORCH_SERVICES else None for s in services]


def node_plan(plans: Sequence[ThreadPlan]) -> ThreadPlan:
    """The plan of one process group sharing an environment (a trainer node's torchrun
    ranks): each rank the fewest threads of the group, all pinned to the group's CPUs."""
    cpus = tuple(c for p in plans for c in p.cpus) if all(p.cpus for p in plans) else ()
    return ThreadPlan(threads=min(p.threads for p in plans), cpus=cpus)


def size_specs(
    setting: TorchThreads,
    specs: Sequence[tuple[ServiceSpec, int]],
    cores: Sequence[int] | None = None,
    shares: Mapping[str, float] = BUSY_SHARES,
) -> None:
    """With auto, add each torch service's thread plan to its environment (a number reaches
    the services in the config). `specs`: the services this machine starts, each with its
    process count (a trainer node: its ranks, else 1)."""
    if setting != "auto":
        return
    kinds = [spec.service for spec, n in specs for _ in range(n)]
    plans = iter(service_plans(setting, kinds, cores, shares))
    for spec, n in specs:
        group = [next(plans) for _ in range(n)]
        sized = [p for p in group if p is not None]
        if sized:
            spec.env = {**spec.env, **node_plan(sized).env()}


def size_scorers(
    setting: ScorerWorkers,
    torch_threads: TorchThreads,
    specs: Sequence[tuple[ServiceSpec, int]],
    cores: Sequence[int] | None = None,
) -> None:
    """With scorer.workers = auto, give each scorer of `specs` (the services this machine
    starts, with their process counts) its share of the cores the torch services' threads
    leave, in its environment (after `size_specs`, whose plans it counts)."""
    scorers = [spec for spec, _ in specs if spec.service == "scorer"]
    if setting != "auto" or not scorers:
        return
    n_cores = len(cores or local_cores())
    busy = sum(
        n * _threads(spec, torch_threads, n_cores)
        for spec, n in specs
        if spec.service in TORCH_SERVICES
    )
    share = str(spare_share(n_cores, busy, len(scorers)))
    for spec in scorers:
        spec.env = {**spec.env, ENV_WORKERS: share}


def _threads(spec: ServiceSpec, setting: TorchThreads, cores: int) -> int:
    """The torch threads a service will run: its plan's, else the setting's (auto: every
    core, as a service `up` did not size)."""
    if ENV_THREADS in spec.env:
        return int(spec.env[ENV_THREADS])
    return cores if setting == "auto" else setting
